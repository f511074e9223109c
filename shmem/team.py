"""Teams: ordered subsets of a World's ranks (OpenSHMEM's ``shmem_team_t``).

:attr:`World.team_world` (``SHMEM_TEAM_WORLD``) holds every rank and
:attr:`World.team_shared` (``SHMEM_TEAM_SHARED``) the ranks whose copies this rank loads
and stores directly (its node). New teams are split from a parent, collectively over the
parent: :meth:`Team.split_strided` (``start``, ``stride``, ``size`` of the parent's ranks)
and :meth:`Team.split_2d` (a grid of ``xrange`` columns). A rank outside the new team gets
None (``SHMEM_TEAM_INVALID``). :meth:`Team.subteam` (an extension) makes a team of any ranks in
any order collectively over those ranks only, as ``torch.distributed.new_group`` needs.

A team has its own MPI communicator (split from the parent's), so its barrier and the
collectives of :class:`collectives.Communicator` made on it involve its members only.
:meth:`Team.create_ctx` makes a :class:`~shmem.rma.Context` whose calls take team ranks.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np

from .errors import ArgumentError, CollectiveMismatchError, ShmemStateError, SignalTimeoutError
from .signals import poll_until

if TYPE_CHECKING:
    from mpi4py import MPI

    from .rma import Context
    from .world import World

__all__ = ["Team", "TeamConfig"]


@dataclass(frozen=True)
class TeamConfig:
    """A team's configuration (``shmem_team_config_t``): how many contexts its members
    expect to create (advisory here: contexts cost no shared resources on the host)."""

    num_contexts: int = 0


class Team:
    """An ordered set of a World's ranks with its own communicator.

    Attributes
    ----------
    members : tuple of int
        World ranks in team order: team rank ``i`` is world rank ``members[i]``.
    """

    def __init__(
        self,
        world: World,
        comm: MPI.Intracomm,
        members: tuple[int, ...],
        config: TeamConfig,
        name: str,
        owned: bool,
    ) -> None:
        self._world = world
        self.comm = comm
        self.members = members
        self._index = {r: i for i, r in enumerate(members)}
        self._config = config
        self.name = name
        self._owned = owned
        self._destroyed = False
        self._epoch = 0

    # -- queries ----------------------------------------------------------------------------

    @property
    def my_pe(self) -> int:
        """This rank's rank in the team (``shmem_team_my_pe``)."""
        return self._index[self._world.rank]

    @property
    def n_pes(self) -> int:
        """The team's size (``shmem_team_n_pes``)."""
        return len(self.members)

    rank = my_pe
    size = n_pes

    @property
    def world(self) -> World:
        return self._world

    @property
    def destroyed(self) -> bool:
        return self._destroyed

    def get_config(self) -> TeamConfig:
        """The configuration the team was made with (``shmem_team_get_config``)."""
        self._check("get_config")
        return self._config

    def translate_pe(self, pe: int, dest: Team) -> int:
        """Rank ``pe`` of this team as a rank of ``dest``, or -1 when it is not a member
        (``shmem_team_translate_pe``)."""
        self._check("translate_pe")
        if not isinstance(dest, Team):
            raise ArgumentError(
                f"Team.translate_pe: invalid dest (got {dest!r} of type {type(dest).__name__}; "
                "expected a Team)"
            )
        dest._check("translate_pe")
        world_rank = self.world_rank(pe, "Team.translate_pe")
        return dest._index.get(world_rank, -1)

    def world_rank(self, pe: int, where: str = "Team.world_rank") -> int:
        """Team rank ``pe`` as a world rank (validated)."""
        n = len(self.members)
        if isinstance(pe, bool) or not isinstance(pe, int | np.integer) or not 0 <= pe < n:
            raise ArgumentError(
                f"{where}: invalid rank (got {pe!r}; expected 0 <= rank < {n}, the size of "
                f"team {self.name})"
            )
        return self.members[int(pe)]

    def __contains__(self, world_rank: object) -> bool:
        return world_rank in self._index

    def __repr__(self) -> str:
        state = ", destroyed" if self._destroyed else ""
        return f"Team({self.name}, my_pe={self.my_pe}, n_pes={self.n_pes}{state})"

    def _check(self, where: str) -> None:
        if self._destroyed:
            raise ShmemStateError(f"Team.{where}: team {self.name} is destroyed")
        self._world.check_open(f"Team.{where}")

    # -- splitting --------------------------------------------------------------------------

    def split_strided(
        self, start: int, stride: int, size: int, config: TeamConfig | None = None
    ) -> Team | None:
        """The team of this team's ranks ``start, start + stride, ...`` (``size`` of them),
        collectively over this team (``shmem_team_split_strided``); None on other ranks.

        Raises
        ------
        ArgumentError
            On every rank, when the ranks named fall outside this team (or ranks disagree).
        """
        self._check("split_strided")
        where = "Team.split_strided"
        error: Exception | None = None
        picked: tuple[int, ...] = ()
        try:
            _check_config(where, "config", config)
            for name, v in (("start", start), ("stride", stride), ("size", size)):
                if isinstance(v, bool) or not isinstance(v, int | np.integer):
                    raise ArgumentError(f"{where}: invalid {name} (got {v!r}; expected an int)")
            if size < 1 or (stride == 0 and size > 1):
                raise ArgumentError(
                    f"{where}: invalid size/stride (got size {size}, stride {stride}; expected "
                    "size >= 1 and a non-zero stride for several ranks)"
                )
            idx = [int(start) + i * int(stride) for i in range(int(size))]
            if min(idx) < 0 or max(idx) >= self.n_pes:
                raise ArgumentError(
                    f"{where}: ranks out of the parent team (got start {start}, stride "
                    f"{stride}, size {size}; expected ranks in [0, {self.n_pes}) of team "
                    f"{self.name})"
                )
            picked = tuple(self.members[i] for i in idx)
        except ArgumentError as exc:
            error = exc
        self._agree(where, ("split_strided", start, stride, size), error)
        return self._split(picked, config, f"{self.name}[{start}::{stride}][:{size}]")

    def split_2d(
        self,
        xrange: int,
        xconfig: TeamConfig | None = None,
        yconfig: TeamConfig | None = None,
    ) -> tuple[Team, Team]:
        """Split into a grid of ``xrange`` columns (``shmem_team_split_2d``), collectively:
        ``(xteam, yteam)``, the ranks of my row (x varies) and of my column (y varies).
        Team rank ``i`` sits at ``x = i % xrange``, ``y = i // xrange``; the last row may be
        short."""
        self._check("split_2d")
        where = "Team.split_2d"
        error: Exception | None = None
        if isinstance(xrange, bool) or not isinstance(xrange, int | np.integer) or xrange < 1:
            error = ArgumentError(f"{where}: invalid xrange (got {xrange!r}; expected >= 1)")
        try:
            _check_config(where, "xconfig", xconfig)
            _check_config(where, "yconfig", yconfig)
        except ArgumentError as exc:
            error = error or exc
        self._agree(where, ("split_2d", xrange), error)
        xr = min(int(xrange), self.n_pes)
        me = self.my_pe
        x, y = me % xr, me // xr
        row = tuple(self.members[i] for i in range(y * xr, min((y + 1) * xr, self.n_pes)))
        col = tuple(self.members[i] for i in range(x, self.n_pes, xr))
        xteam = self._split_by(y, row, xconfig, f"{self.name}.x[{y}]")
        yteam = self._split_by(x, col, yconfig, f"{self.name}.y[{x}]")
        return xteam, yteam

    def subteam(
        self, ranks: Sequence[int], *, tag: int = 0, config: TeamConfig | None = None
    ) -> Team:
        """The team of this team's ranks ``ranks``, in that order, made collectively over
        those ranks only (``MPI_Comm_create_group``): the other ranks take no part, as in
        ``torch.distributed.new_group``. This rank must be one of them.

        Every member must pass the same ``ranks``: MPI's ``Comm_create_group`` needs them
        and has no deadline (as in MPI, members that name different groups may wait there
        for ever). Differences it lets through are checked after it.

        Parameters
        ----------
        ranks : sequence of int
            Ranks of this team, distinct; team rank ``i`` of the result is ``ranks[i]``.
        tag : int
            Tells apart subteams being made at the same time by overlapping rank sets.

        Raises
        ------
        ArgumentError
            Here, before any exchange, for invalid ``ranks`` or when this rank is not one of
            them (members passing the same ``ranks`` all raise it).
        CollectiveMismatchError
            On every member, when the members' ``ranks`` differ in a way MPI let through.
        """
        self._check("subteam")
        where = "Team.subteam"
        from mpi4py import MPI

        _check_config(where, "config", config)
        picked = tuple(ranks) if isinstance(ranks, list | tuple | range) else None
        if (
            not picked
            or any(isinstance(r, bool) or not isinstance(r, int | np.integer) for r in picked)
            or len(set(picked)) != len(picked)
            or not all(0 <= r < self.n_pes for r in picked)
        ):
            raise ArgumentError(
                f"{where}: invalid ranks (got {ranks!r}; expected distinct ranks of team "
                f"{self.name}, in [0, {self.n_pes}))"
            )
        if self.my_pe not in picked:
            raise ArgumentError(
                f"{where}: rank {self.my_pe} of team {self.name} is not one of ranks "
                f"{list(picked)} (only the members make a subteam)"
            )
        group = self.comm.Get_group()
        sub = group.Incl([int(r) for r in picked])
        try:
            comm = self.comm.Create_group(sub, int(tag))
        finally:
            sub.Free()
            group.Free()
        members = tuple(self.members[int(r)] for r in picked)
        team = Team(
            self._world,
            comm,
            members,
            config or TeamConfig(),
            f"{self.name}{list(picked)}",
            True,
        )
        try:
            team._agree(where, ("subteam", members), None)
        except BaseException:
            if comm != MPI.COMM_NULL:
                comm.Free()
            raise
        return team

    def _split(self, picked: tuple[int, ...], config: TeamConfig | None, name: str) -> Team | None:
        from mpi4py import MPI

        me = self._world.rank
        inside = me in picked
        comm = self.comm.Split(
            color=0 if inside else MPI.UNDEFINED, key=picked.index(me) if inside else 0
        )
        if not inside:
            return None
        return Team(
            self._world, cast("MPI.Intracomm", comm), picked, config or TeamConfig(), name, True
        )

    def _split_by(
        self, color: int, members: tuple[int, ...], config: TeamConfig | None, name: str
    ) -> Team:
        comm = self.comm.Split(color=color, key=members.index(self._world.rank))
        return Team(
            self._world, cast("MPI.Intracomm", comm), members, config or TeamConfig(), name, True
        )

    def _agree(self, where: str, record: tuple[object, ...], error: Exception | None) -> None:
        """Every member raises together on a bad argument; differing arguments are refused."""
        from .agreement import allgather_within

        records = allgather_within(
            self.comm,
            (record, None if error is None else str(error)),
            self._world.config.signal.timeout_s,
            where,
            self._world.heap.progress,
        )
        if error is not None:
            raise error
        bad = [(r, e) for r, (_, e) in enumerate(records) if e is not None]
        if bad:
            raise ArgumentError(
                f"{where}: invalid arguments on other ranks of team {self.name}: "
                + "; ".join(f"team rank {r}: {e}" for r, e in bad)
            )
        if any(rec != records[0][0] for rec, _ in records):
            listing = "; ".join(f"team rank {r}: {rec}" for r, (rec, _) in enumerate(records))
            raise CollectiveMismatchError(f"{where}: ranks disagree ({listing})")

    # -- synchronisation and contexts --------------------------------------------------------

    def barrier(self, timeout: float | None = None) -> None:
        """Every member has arrived and this rank's earlier puts are complete
        (``shmem_team_sync`` after ``shmem_quiet``, as ``shmem_barrier``); non-blocking MPI
        within the deadline, so a missing member raises instead of hanging."""
        self._check("barrier")
        world = self._world
        if not world.heap.device_memory:
            world.quiet()
        self._arrive(timeout, "Team.barrier")

    def _arrive(self, timeout: float | None, where: str) -> None:
        world = self._world
        limit = world.config.signal.timeout_s if timeout is None else timeout
        if not world.heap.device_memory:
            world.heap.fence()  # this rank's stores before its arrival
        req = self.comm.Ibarrier()
        if not poll_until(req.Test, time.monotonic() + limit, world.heap.progress):
            raise SignalTimeoutError(
                f"{where}: rank {self.my_pe} of team {self.name} timed out after "
                f"{limit:g} s (a member did not arrive); the team is unusable afterwards",
                operation="team barrier",
                slot=-1,
                expected="every member",
                last_value=0,
                peers=(),
            )

    def sync(self, timeout: float | None = None) -> None:
        """Every member has arrived; this rank's earlier stores (blocking puts) are complete
        and visible, its non-blocking operations are not completed (``shmem_team_sync``:
        :meth:`barrier` is this after a quiet)."""
        self._check("sync")
        self._arrive(timeout, "Team.sync")

    def create_ctx(self) -> Context:
        """A communication context whose calls take ranks of this team
        (``shmem_team_create_ctx``; local)."""
        self._check("create_ctx")
        from .rma import Context

        return Context(self._world, self)

    def destroy(self) -> None:
        """Release the team's communicator (``shmem_team_destroy``; collective over the team).
        The world and shared teams are owned by the World and cannot be destroyed."""
        if self._destroyed:
            return
        if not self._owned:
            raise ShmemStateError(f"Team.destroy: team {self.name} belongs to the World")
        self._destroyed = True
        if not self._world.finalized:
            self.comm.Free()

    def __enter__(self) -> Team:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None and self._owned:
            self.destroy()


def _check_config(where: str, name: str, config: object) -> None:
    if config is not None and not isinstance(config, TeamConfig):
        raise ArgumentError(
            f"{where}: invalid {name} (got {config!r} of type {type(config).__name__}; "
            "expected a TeamConfig or None)"
        )
