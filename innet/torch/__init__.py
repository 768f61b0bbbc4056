"""``import innet.torch``: torch.distributed gets the backend "innet" (innet.integrations.torch.group).

    import innet.torch
    dist.init_process_group("innet")       # collectives through the emulated network
    innet.torch.set_mode(group, "ring")    # a group's scheme: innet (default), pbox or ring
"""

from innet.integrations.torch.group import InnetGroup, register, set_mode

register()

__all__ = ["InnetGroup", "register", "set_mode"]
