"""A Communicator's counters (``comm.stats``): calls, staged bytes, scratch growths and calls
per algorithm."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CommStats", "Counts"]


class Counts(dict[str, int]):
    """A dict of counts whose missing keys read as 0 (``counts[k] += 1`` in one step)."""

    def __missing__(self, key: str) -> int:
        return 0


@dataclass
class CommStats:
    """Counters: calls made, bytes of inputs copied into scratch (0 on the zero-copy path),
    scratch growths, and calls per algorithm.

    Parameters
    ----------
    calls : int
        Collective calls made.
    staged_bytes : int
        Bytes of inputs copied into scratch (0 on the zero-copy path).
    scratch_growths : int
        Times the scratch space grew.
    algorithms : dict of str to int, optional
        Calls per algorithm name (None until the first call).
    """

    calls: int = 0
    staged_bytes: int = 0
    scratch_growths: int = 0
    algorithms: dict[str, int] | None = field(default=None)

    def count(self, algorithm: str) -> None:
        """Count one call of ``algorithm``.

        Parameters
        ----------
        algorithm : str
            The algorithm's name (``"one_shot"``, ``"two_shot"``...).
        """
        if self.algorithms is None:
            self.algorithms = Counts()
        self.algorithms[algorithm] += 1
