"""System tools the RTL simulators need, and how to install each (one table, named in every
skip message and error so that the hint is a real package name)."""

# executable -> (Debian/Ubuntu package, Homebrew formula)
PACKAGES = {
    "verilator": ("verilator", "verilator"),
    "iverilog": ("iverilog", "icarus-verilog"),
    "vvp": ("iverilog", "icarus-verilog"),
    "g++": ("g++", "gcc"),
    "make": ("make", "make"),
    "tclsh": ("tcl", "tcl-tk"),
}


def install_hint(exe: str) -> str:
    """'apt-get install PKG' (and the Homebrew name where it differs) for a missing executable."""
    apt, brew = PACKAGES.get(exe, (exe, exe))
    return f"apt-get install {apt}; macOS: brew install {brew}"
