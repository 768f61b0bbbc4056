"""``import innet.torch``: torch.distributed gets the backend "innet" (innet.integrations.torch.group).

    import innet.torch
    dist.init_process_group("innet")       # collectives through the emulated network
    innet.torch.set_mode(group, "ring")    # a group's scheme: innet (default), pbox or ring
"""

import os

from innet.integrations.launch import watch
from innet.integrations.torch.group import InnetGroup, register, set_mode

register(default=bool(os.environ.get("INNET_RUN")))  # under innet launch: the default backend of CPU tensors
if os.environ.get(watch.WATCH):  # under innet launch: each rank says when it has joined
    watch.install()

__all__ = ["InnetGroup", "register", "set_mode"]
