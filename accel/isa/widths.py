"""Fixed widths of the instruction format (the other field widths derive from the AccelConfig)."""

INSN_BITS = 128
"""Every instruction is one 128-bit word; a config whose fields do not fit is rejected."""

OPCODE_BITS = 3
DEP_FLAG_BITS = 4
MEM_TYPE_BITS = 3
SIZE_BITS = 16  # y_size, x_size, x_stride of LOAD/STORE
PAD_BITS = 4  # each of the four paddings of LOAD
LOOP_ITER_BITS = 14  # iter_out, iter_in of GEMM/ALU
ALU_OPCODE_BITS = 4
ALU_IMM_BITS = 16
