"""User-facing flows on top of every package (the top floor of DESIGN.md): `accel sweep`.

Nothing in accel/, sim/, compiler/ or host_runtime/ imports this package.
"""
