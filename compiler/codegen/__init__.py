"""Code generators. llvm: CPU code through llvmlite (host JIT or cross-compiled objects)."""
from .llvm import CodegenLLVM
from .runtime import CrossModule, Module, num_threads, register_extern, set_num_threads
