"""Broadcasts and point-to-point exchanges beside the grid collectives, timed and counted.

:class:`ExchangeComm` is a :class:`plexus_tune.trainer.comm.GridComm` (process groups
per axis, the collectives, the precision of each class, the byte counter) with the
operations of the CAGNET and partitioned algorithms:

- ``broadcast``: a dense block from the rank at one coordinate of an axis to its group;
  the root counts ``(g - 1) M`` bytes, the others none;
- ``broadcast_csr``: a sparse adjacency piece (crow, col, values), counted in the
  ``adjacency`` class at its stored size, never at a reduced precision;
- ``exchange``: point-to-point messages to and from chosen ranks; a sender counts each
  message it sends.

A dense block travels at its class's precision (docs/comm-precision.md): 16-bit blocks
are cast, integer blocks quantized per row with their zero point and scale
(:func:`plexus_tune.model.comm_precision.block_bytes` bytes); the sender keeps its own
unrounded block. Time inside the process-group calls goes to ``comm_ms`` (and
``broadcast_ms`` or ``point_to_point_ms``), the encoding and decoding to ``quant_ms``.
"""

from __future__ import annotations

import warnings

import torch

from plexus_tune.model.comm_precision import ADJACENCY_CLASS, PRECISION_BITS, block_bytes
from plexus_tune.model.grid import rank_of
from plexus_tune.trainer.comm import GridComm

_LOW_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class ExchangeComm(GridComm):
    """A :class:`GridComm` with broadcasts and point-to-point exchanges (module docstring).

    ``dtype`` and ``device`` are those of the dense blocks a non-root rank receives.
    """

    def __init__(self, grid, rank: int, timer, *, dtype=torch.float32, device="cpu", **kwargs):
        super().__init__(grid, rank, timer, **kwargs)
        self.dtype = dtype
        self.device = torch.device(device)

    def rank_at(self, axis: int, coord: int) -> int:
        """Global rank of the member of this rank's ``axis`` group at coordinate ``coord``."""
        c = list(self.coords)
        c[axis] = int(coord)
        return int(rank_of(c[0], c[1], c[2], self.grid))

    # -- encoding of dense blocks at a reduced precision ------------------------------
    def _encode(self, block: torch.Tensor, precision: str) -> torch.Tensor:
        from plexus_tune.trainer.precision import _encode_chunks

        t0 = self.timer.now()
        if precision in _LOW_DTYPES:
            out = block.to(_LOW_DTYPES[precision]).contiguous()
        else:
            out = _encode_chunks(block.reshape(block.shape[0], -1).to(torch.float32), 1,
                                 PRECISION_BITS[precision], self.generator).view(-1)
        self.timer.add(t0, "quant_ms")
        return out

    def _wire_buffer(self, shape, precision: str) -> torch.Tensor:
        if precision in _LOW_DTYPES:
            return torch.empty(shape, dtype=_LOW_DTYPES[precision], device=self.device)
        rows, cols = int(shape[0]), int(shape[1])
        return torch.empty(int(block_bytes(rows, cols, precision)), dtype=torch.uint8, device=self.device)

    def _decode(self, wire: torch.Tensor, shape, precision: str) -> torch.Tensor:
        from plexus_tune.trainer.precision import _decode_chunks

        t0 = self.timer.now()
        if precision in _LOW_DTYPES:
            out = wire.to(self.dtype)
        else:
            rows, cols = int(shape[0]), int(shape[1])
            out = _decode_chunks(wire.view(1, -1), 1, rows, cols, PRECISION_BITS[precision])[0].to(self.dtype)
        self.timer.add(t0, "quant_ms")
        return out

    # -- broadcasts ------------------------------------------------------------------
    def broadcast(self, block: torch.Tensor | None, shape, axis: int, root: int, comm_class: str = "aggregation"):
        """The root's dense ``shape`` block on every rank of the ``axis`` group.

        ``root`` is the root's coordinate on ``axis``; ``block`` is this rank's block
        if it is the root (ignored otherwise). An empty block is not sent.
        """
        size = self.grid[axis]
        me = self.coords[axis] == int(root)
        if size == 1 or me:
            if size > 1 and block.numel():
                self._broadcast_wire(block, shape, axis, root, comm_class)
            return block
        if int(torch.Size(shape).numel()) == 0:
            return torch.zeros(shape, dtype=self.dtype, device=self.device)
        return self._broadcast_wire(None, shape, axis, root, comm_class)

    def _broadcast_wire(self, block, shape, axis: int, root: int, comm_class: str):
        size = self.grid[axis]
        precision = self._precision_of(comm_class)
        me = block is not None
        if precision == "fp32":
            wire = block.contiguous() if me else torch.empty(shape, dtype=self.dtype, device=self.device)
        else:
            wire = self._encode(block, precision) if me else self._wire_buffer(shape, precision)
        t0 = self.timer.now()
        self.dist.broadcast(wire, src=self.rank_at(axis, root), group=self.groups[axis])
        self.timer.add_comm(t0, "broadcast", axis)
        if me:
            self._count(comm_class, (size - 1) * wire.numel() * wire.element_size())
            return block
        return wire if precision == "fp32" else self._decode(wire, shape, precision)

    def broadcast_csr(self, piece, rows: int, cols: int, nnz: int, axis: int, root: int, index_dtype):
        """The root's sparse ``rows x cols`` piece (``nnz`` entries) as a torch CSR tensor on every
        rank of the ``axis`` group; counted in the ``adjacency`` class (crow, col and values)."""
        size = self.grid[axis]
        if size == 1 or self.coords[axis] == int(root):
            if size > 1:
                tensors = (piece.crow_indices(), piece.col_indices(), piece.values())
                self._broadcast_arrays([t.contiguous() for t in tensors], axis, root)
                self._count(ADJACENCY_CLASS, (size - 1) * sum(t.numel() * t.element_size() for t in tensors))
            return piece
        crow = torch.empty(rows + 1, dtype=index_dtype, device=self.device)
        col = torch.empty(nnz, dtype=index_dtype, device=self.device)
        val = torch.empty(nnz, dtype=self.dtype, device=self.device)
        self._broadcast_arrays([crow, col, val], axis, root)
        with warnings.catch_warnings():  # "sparse CSR support is in beta"
            warnings.simplefilter("ignore", UserWarning)
            return torch.sparse_csr_tensor(crow, col, val, size=(rows, cols), device=self.device,
                                           check_invariants=False)

    def _broadcast_arrays(self, arrays, axis: int, root: int) -> None:
        src = self.rank_at(axis, root)
        t0 = self.timer.now()
        for t in arrays:
            if t.numel():
                self.dist.broadcast(t, src=src, group=self.groups[axis])
        self.timer.add_comm(t0, "broadcast", axis)

    # -- point to point ---------------------------------------------------------------
    def exchange(self, sends: dict, recv_shapes: dict, comm_class: str = "aggregation", axis: int = 0) -> dict:
        """Send ``sends[peer]`` (dense blocks) to each global rank ``peer`` and receive a
        ``recv_shapes[peer]`` block from each; returns ``{peer: received block}``.

        Empty messages are not sent. Each rank counts the bytes of what it sends.
        """
        precision = self._precision_of(comm_class)
        ops, wires, sent_bytes = [], {}, 0
        P2POp = self.dist.P2POp
        for peer, block in sorted(sends.items()):
            if block.numel() == 0:
                continue
            wire = block.contiguous() if precision == "fp32" else self._encode(block, precision)
            sent_bytes += wire.numel() * wire.element_size()
            ops.append(P2POp(self.dist.isend, wire, int(peer)))
        for peer, shape in sorted(recv_shapes.items()):
            if int(torch.Size(shape).numel()) == 0:
                continue
            wire = (torch.empty(shape, dtype=self.dtype, device=self.device) if precision == "fp32"
                    else self._wire_buffer(shape, precision))
            wires[peer] = wire
            ops.append(P2POp(self.dist.irecv, wire, int(peer)))
        if ops:
            t0 = self.timer.now()
            for work in self.dist.batch_isend_irecv(ops):
                work.wait()
            self.timer.add_comm(t0, "point_to_point", axis)
        self._count(comm_class, sent_bytes)
        out = {}
        for peer, shape in recv_shapes.items():
            if peer not in wires:
                out[peer] = torch.zeros(shape, dtype=self.dtype, device=self.device)
            elif precision == "fp32":
                out[peer] = wires[peer]
            else:
                out[peer] = self._decode(wires[peer], shape, precision)
        return out
