"""The MoE half of a decoder layer of the calibration stack (a mixin of `stack.Layer`): routing, one expert, and
the routed experts either as a per-expert loop (expert counts read on the host) or as two grouped GEMMs with the
routing on the device (capturable as a CUDA graph). The layer provides the weights (`router_w`, `e_gate_up`,
`e_down`, the shared experts' `gate_up`/`down`), `act` and the rank shapes `s`."""
from __future__ import annotations


class MoEOps:
    def route(self, r):
        """Router GEMM, softmax, top-k, and the sort that groups tokens by expert."""
        import torch

        probs = torch.softmax((r @ self.router_w).float(), dim=-1)
        weights, experts = probs.topk(self.s.top_k, dim=-1)
        flat = experts.flatten()
        order = flat.argsort()
        counts = torch.bincount(flat, minlength=self.s.experts).tolist()  # host sync, as a grouped loop needs
        return weights.flatten()[order].to(r.dtype), order // self.s.top_k, counts

    def expert(self, e: int, r, tok, w, out):
        """One routed expert over its tokens: gather, gate_up, act, down, weighted scatter-add."""
        xs = r.index_select(0, tok)
        y = self.act(xs @ self.e_gate_up[e]) @ self.e_down[e]
        out.index_add_(0, tok, y * w.unsqueeze(-1))

    def route_on_device(self, r):
        """Routing that never waits for the host: per-expert end offsets are computed on the device
        (scatter-add, cumsum), so the whole MoE layer can be captured in a CUDA graph."""
        import torch

        probs = torch.softmax((r @ self.router_w).float(), dim=-1)
        weights, experts = probs.topk(self.s.top_k, dim=-1)
        flat = experts.flatten()
        order = flat.argsort()
        counts = torch.zeros(self.s.experts, dtype=torch.int64, device=r.device).scatter_add_(
            0, flat, torch.ones_like(flat))
        return weights.flatten()[order].to(r.dtype), order // self.s.top_k, counts.cumsum(0).to(torch.int32)

    def mlp_grouped(self, r):
        """All routed experts as two grouped GEMMs (torch._grouped_mm over the expert-sorted tokens), as
        fused-MoE kernels run them: no per-expert Python loop and no host synchronisation."""
        import torch

        w, tok, offs = self.route_on_device(r)
        xs = r.index_select(0, tok)
        y = torch._grouped_mm(self.act(torch._grouped_mm(xs, self.e_gate_up, offs=offs)), self.e_down, offs=offs)
        out = torch.zeros_like(r).index_add_(0, tok, y * w.unsqueeze(-1))
        if self.s.shared_intermediate:
            out = out + self.down(self.act(self.gate_up(r)))
        return out

    def moe_mlp(self, r):
        """The routed experts (grouped or a loop, as `moe_impl` says) plus the shared experts, if any."""
        if self.moe_impl == "grouped":
            return self.mlp_grouped(r)
        import torch

        w, tok, counts = self.route(r)
        out = torch.zeros_like(r)
        start = 0
        for e, c in enumerate(counts):
            if c:
                self.expert(e, r, tok[start:start + c], w[start:start + c], out)
                start += c
        if self.s.shared_intermediate:
            out = out + self.down(self.act(self.gate_up(r)))
        return out
