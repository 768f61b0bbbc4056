"""torch.distributed ranks inside Mininet hosts, one per worker host: the gloo backend's all-reduce and DDP trained
through innet's switches (mininet.py starts them; rank.py is one rank's process)."""
