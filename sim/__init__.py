"""Simulators of the accelerator: functional (bit-exact reference), timing model, RTL harnesses."""
