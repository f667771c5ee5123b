"""The cpu target's blocked layout between convs (compiler.graph.passes.nchwc_layout) on random
networks (the strategy of test_random_networks: convs of random widths, 24 and 3 channels among
them, batch norms, activations, residual adds, channel concats that may not meet on a block, pools),
at batch 1 and 2: the output matches onnxruntime (float, 1e-4), with and without the pass."""
import numpy as np
import onnxruntime as ort
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compiler
from compiler.frontend import zoo

from .test_random_networks import networks


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(net=networks(), batch=st.sampled_from([1, 2]))
def test_random_network_blocked_layout_matches_onnxruntime(net, batch):
    for v in (net.graph.input[0], net.graph.output[0]):
        v.type.tensor_type.shape.dim[0].dim_value = batch
    del net.graph.value_info[:]
    f = zoo.sample_inputs(net, 1, seed=4)[0]
    so = ort.SessionOptions()   # as test_random_networks: onnxruntime's own NCHWc rewrite off
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    want = ort.InferenceSession(net.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, f)[0]
    mod = compiler.build_model(net, target="cpu")
    assert mod.meta["fallbacks"] == []
    got = next(iter(mod.run(f)[0].values()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
