"""Figures of decoding: a traced step's draft tree (`trace_render`). Needs matplotlib."""
