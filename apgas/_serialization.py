"""Pickling for the wire: protocol 5, cloudpickle for closures and ``__main__``.

Large buffers (numpy arrays) travel out of band as their own frames, so an
array is neither copied into the pickle stream nor out of it.
"""

from __future__ import annotations

import io
import pickle
from typing import Any, Sequence

import cloudpickle

__all__ = ["dumps", "loads", "OOB_MIN_BYTES"]

#: buffers smaller than this are pickled in band (a separate frame costs more)
OOB_MIN_BYTES = 64 * 1024


def dumps(obj: Any) -> list:
    """Return ``[body, *buffers]``: the pickle stream and its out-of-band buffers."""
    buffers: list = []

    def keep_large(buf: pickle.PickleBuffer) -> bool:
        view = buf.raw()
        if view.nbytes < OOB_MIN_BYTES:
            return True  # in band
        buffers.append(view)
        return False

    out = io.BytesIO()
    cloudpickle.CloudPickler(out, protocol=5, buffer_callback=keep_large).dump(obj)
    return [out.getbuffer(), *buffers]


def loads(body: Any, buffers: Sequence[Any] = ()) -> Any:
    return pickle.loads(body, buffers=buffers)
