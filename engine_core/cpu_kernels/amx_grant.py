"""Whether an AMX kernel library may use the tiles in this process (amx_tiles.h asks the OS once)."""

import ctypes
import logging

logger = logging.getLogger("nvllm")


def amx_granted(library, what: str) -> bool:
    """True where the OS grants the tile state; a refusal is logged with `what` runs instead."""
    library.amx_ready.restype = ctypes.c_int
    if library.amx_ready():
        return True
    logger.warning("the OS refused this process AMX's tile state (arch_prctl ARCH_REQ_XCOMP_PERM): %s", what)
    return False
