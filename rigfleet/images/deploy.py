"""The images' part of the deploy: one fact, the host's staging plan (built once per host),
the preflight refusal (docs/images.md, "Refused before any host changes")::

    preflight_images(want)             # in roles/preflight.py: refuses, or logs the notes
    plan = staging_plan(ctx.want)      # in roles/images.py: the plan preflight checked
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

from pyinfra import host
from pyinfra.api import FactBase
from pyinfra.api.state import State
from typing_extensions import override

from rigfleet.desired import DesiredHost
from rigfleet.facts import read_fact
from rigfleet.fleetcache import cache_settings
from rigfleet.image_sources import NO_CHECK, ImageSource
from rigfleet.images.checks import SourceChecker
from rigfleet.images.hoststate import ROOT, HostImageState, parse_state, state_script
from rigfleet.images.plan import StagingPlan, plan_host, presence, wanted_images
from rigfleet.validate import ValidationError

_RUNS: weakref.WeakKeyDictionary[State, tuple[SourceChecker, dict[str, StagingPlan]]] = (
    weakref.WeakKeyDictionary())


class ImagesRefused(ValidationError):
    """A host cannot get its pinned images (one line per problem)."""


class ImageState(FactBase[HostImageState]):
    """The host's copies of the pinned images, its archives and free space."""

    default = HostImageState

    @override
    def command(self, refs: tuple[str, ...], archives: tuple[str, ...],
                spaces: tuple[str, ...]) -> str:
        return state_script(refs, archives, spaces)

    @override
    def process(self, output: list[str]) -> HostImageState:
        return parse_state(output)


def fact_arguments(want: DesiredHost) -> dict[str, Any]:
    wanted, _ = wanted_images({n: s.pins for n, s in want.stacks.items()})
    sources = want.settings.image_sources
    return {"refs": tuple(dict.fromkeys(r for w in wanted for r in w.refs)),
            "archives": tuple(str(s.path) for s in sources if s.kind == "host-archive"),
            "spaces": (ROOT, *dict.fromkeys(s.upload_dir for s in sources
                                            if s.kind == "archive" and s.via == "upload"))}


def build_plan(want: DesiredHost, state: HostImageState, checker: SourceChecker,
               caches: Sequence[ImageSource] = ()) -> StagingPlan:
    """The host's staging plan from its state; ``caches`` are tried before ``image_sources``."""
    wanted, conflicts = wanted_images({n: s.pins for n, s in want.stacks.items()})
    sources = (*caches, *want.settings.image_sources)
    results = {w.image: checker.results(w, want.settings, state, sources) for w in wanted
               if presence(w, state).state == "absent"}
    return plan_host(want.name, wanted, state, results, conflicts)


def staging_plan(want: DesiredHost) -> StagingPlan:
    checker, plans = _RUNS.setdefault(host.state, (SourceChecker(), {}))
    if want.name not in plans:
        facts = read_fact(ImageState, **fact_arguments(want))
        # The fleet caches' registries are not checked from here: the host falls back.
        caches = tuple(ImageSource("registry", url=c.registry_url, check=NO_CHECK, cache=c.name)
                       for c in cache_settings(host.inventory))
        plans[want.name] = build_plan(want, facts, checker, caches)
    return plans[want.name]


def preflight_images(want: DesiredHost) -> None:
    """Raise ``ImagesRefused`` when the host cannot get an image it stages; log the notes."""
    plan = staging_plan(want)
    for note in plan.notes:
        host.log(note)
    if plan.problems:
        raise ImagesRefused(list(plan.problems))
