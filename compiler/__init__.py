"""The compiler: tensor expressions and schedules (te), the loop IR (tir) and its passes,
lowering, code generation (LLVM CPU), and build()."""
