"""Plain forwarding: every packet goes out of the port its destination is routed to."""

from __future__ import annotations

from innet import SwitchProgram, on_batch, on_packet


class Forward(SwitchProgram):
    name = "forward"

    @on_packet("contribution")
    @on_packet("result")
    @on_packet("routed")
    def forward(self, ctx, pkt):
        return ctx.route(pkt)

    @on_batch("routed")
    def forward_many(self, ctx, batch):
        return ctx.route_many(batch), ()
