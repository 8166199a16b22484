"""kiln from Python."""
from ._kiln import *  # noqa: F401,F403
from ._kiln import __version__  # noqa: F401
