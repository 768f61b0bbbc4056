"""Plain forwarding: every packet goes out of the port its destination is routed to.

Routed packets need no handler: the runtime's default forwards them by
address (``ctx.route``, a block at a time with ``ctx.route_many``).
"""

from __future__ import annotations

from innet import SwitchProgram, on_packet


class Forward(SwitchProgram):
    name = "forward"

    @on_packet("contribution")
    @on_packet("result")
    def forward(self, ctx, pkt):
        return ctx.route(pkt)
