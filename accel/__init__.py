"""The accelerator: its configuration and ISA (accel.isa) and its Amaranth RTL (accel.hw)."""
