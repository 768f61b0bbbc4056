"""``--data-plane ebpf``: the sum all-reduce switch as a tc ingress program (switch.c), built once per run
(build.py) and loaded, fed its plan and read back by each switch process (loader.py)."""
