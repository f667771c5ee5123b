"""CPU schedules found by search (AutoTVM's idea): a schedule space per heavy kernel (space), a
learned cost model ranking candidates (cost), measurement through the real build path and a
JSON-lines tuning log keyed by workload and ISA (tuner, tuning_log). compiler.targets.cpu asks a
CpuTuner for each kernel's configuration; the heuristics are the space's default point."""
from .cost import CostModel, features
from .space import FAMILIES, Workload, extract_workload, space
from .tuner import DEFAULT_TRIALS, CandidateError, CpuTuner, TuneOptions
from .tuning_log import TuningBook, TuningLogError, default_log_path, host_isa, read_log

__all__ = ["CostModel", "features", "FAMILIES", "Workload", "extract_workload", "space", "DEFAULT_TRIALS",
           "CandidateError", "CpuTuner", "TuneOptions", "TuningBook", "TuningLogError", "default_log_path",
           "host_isa", "read_log"]
