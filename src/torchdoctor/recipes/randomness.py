"""The sources of randomness a script uses, and whether each was seeded before its first use
(the repro mode). Python's `random` and NumPy's legacy global generator are watched by wrapping
their module-level functions; torch's generators through the random ops the repro mode's
function mode sees (ops given their own `generator=` are the script's business); DataLoader
workers when an iterator with workers is made. A source counts as unseeded when it was drawn
from before any seed call of it (`random.seed(None)` and `torch.seed()` seed from the clock:
they count as no seed)."""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from torchdoctor.recipes.sites import user_site

if TYPE_CHECKING:
    from torchdoctor.telemetry.patches import Hooks

PY_RANDOM = (
    "random", "uniform", "triangular", "randint", "randrange", "choice", "choices", "shuffle",
    "sample", "gauss", "normalvariate", "lognormvariate", "expovariate", "vonmisesvariate",
    "gammavariate", "betavariate", "paretovariate", "weibullvariate", "getrandbits", "randbytes",
    "binomialvariate",
)  # fmt: skip
NP_RANDOM = (
    "rand", "randn", "randint", "random", "random_sample", "ranf", "sample", "choice", "shuffle",
    "permutation", "normal", "uniform", "standard_normal", "binomial", "poisson", "beta", "gamma",
    "exponential", "multinomial", "bytes", "random_integers", "laplace", "logistic", "lognormal",
)  # fmt: skip
# torch ops that draw from a generator (Tensor methods and functions share these names)
TORCH_RANDOM = frozenset(
    {
        "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like",
        "bernoulli", "bernoulli_", "multinomial", "normal", "normal_", "poisson", "uniform_",
        "random_", "exponential_", "geometric_", "log_normal_", "cauchy_", "dropout", "dropout_",
        "alpha_dropout", "feature_alpha_dropout", "dropout1d", "dropout2d", "dropout3d", "rrelu",
        "rrelu_", "native_dropout", "gumbel_softmax",
    }
)  # fmt: skip
# CUDA ops without a deterministic implementation in the forward or the backward pass, unless
# torch.use_deterministic_algorithms(True) picks another (PyTorch's reproducibility notes)
NONDETERMINISTIC_CUDA = frozenset(
    {
        "index_add", "index_add_", "index_copy", "index_copy_", "index_put", "index_put_",
        "put_", "scatter_add", "scatter_add_", "scatter_reduce", "scatter_reduce_", "gather",
        "index_select", "embedding", "embedding_bag", "ctc_loss", "interpolate", "upsample",
        "adaptive_avg_pool2d", "adaptive_avg_pool3d", "adaptive_max_pool2d", "avg_pool3d",
        "max_pool3d", "fractional_max_pool2d", "fractional_max_pool3d", "nll_loss", "histc",
        "bincount", "kthvalue", "median", "grid_sample", "cumsum", "pad", "take",
    }
)  # fmt: skip
SITES_KEPT = 3


class Source:
    __slots__ = ("seeded", "sites", "unseeded_uses", "uses")

    def __init__(self) -> None:
        self.seeded = False
        self.uses = 0
        self.unseeded_uses = 0
        self.sites: list[str] = []  # where it was drawn from before a seed


class Randomness:
    def __init__(self, torch: Any, hooks: Hooks) -> None:
        self.torch = torch
        self.thread = threading.main_thread().ident
        self.sources: dict[str, Source] = {}
        self.cudnn_benchmark_site: str | None = None
        self.cuda_used = False
        self.deterministic_algorithms = bool(torch.are_deterministic_algorithms_enabled())
        self._wrap_module(sys.modules["random"], "random", PY_RANDOM, hooks)
        self._patch_seed(sys.modules["random"], "seed", ("random",), hooks, none_unseeds=True)
        self._patch_seed(sys.modules["random"], "setstate", ("random",), hooks)
        if importlib.util.find_spec("numpy") is not None:
            import numpy

            self._wrap_module(numpy.random, "numpy", NP_RANDOM, hooks)
            self._patch_seed(numpy.random, "seed", ("numpy",), hooks, none_unseeds=True)
            self._patch_seed(numpy.random, "set_state", ("numpy",), hooks)
            self._patch_default_rng(numpy.random, hooks)
        both = ("torch_cpu", "torch_cuda")
        for owner in (torch, torch.random):
            self._patch_seed(owner, "manual_seed", both, hooks)
            self._patch_seed(owner, "seed", both, hooks, unseeds=True)
        self._patch_seed(torch, "set_rng_state", ("torch_cpu",), hooks)
        for name in ("manual_seed", "manual_seed_all", "set_rng_state", "set_rng_state_all"):
            if hasattr(torch.cuda, name):
                self._patch_seed(torch.cuda, name, ("torch_cuda",), hooks)
        self._patch_workers(torch, hooks)

    def source(self, name: str) -> Source:
        if name not in self.sources:
            self.sources[name] = Source()
        return self.sources[name]

    def used(self, name: str, site: str | None) -> None:
        source = self.source(name)
        source.uses += 1
        if not source.seeded:
            source.unseeded_uses += 1
            if site and site not in source.sites and len(source.sites) < SITES_KEPT:
                source.sites.append(site)

    # -- Python and NumPy ----------------------------------------------------------------------
    def _mine(self) -> bool:
        return threading.get_ident() == self.thread

    def _wrap_module(
        self, module: Any, name: str, functions: tuple[str, ...], hooks: Hooks
    ) -> None:
        for fn_name in functions:
            original = getattr(module, fn_name, None)
            if original is None:
                continue
            hooks.patch(module, fn_name, self._wrap(name, original))

    def _wrap(self, name: str, original: Any) -> Any:
        watch = self

        @functools.wraps(original)
        def draw(*args: Any, **kwargs: Any) -> Any:
            if watch._mine():
                site = user_site(sys._getframe(1))
                if site != "":  # "" = torchdoctor's own call
                    watch.used(name, site)
            return original(*args, **kwargs)

        return draw

    def _patch_seed(
        self,
        owner: Any,
        fn_name: str,
        sources: tuple[str, ...],
        hooks: Hooks,
        none_unseeds: bool = False,
        unseeds: bool = False,
    ) -> None:
        original = getattr(owner, fn_name, None)
        if original is None:
            return
        watch = self

        @functools.wraps(original)
        def seed(*args: Any, **kwargs: Any) -> Any:
            if watch._mine() and user_site(sys._getframe(1)) != "":
                given = args[0] if args else kwargs.get("a", kwargs.get("seed"))
                clock = unseeds or (none_unseeds and given is None)
                for name in sources:
                    watch.source(name).seeded = not clock
            return original(*args, **kwargs)

        hooks.patch(owner, fn_name, seed)

    def _patch_default_rng(self, np_random: Any, hooks: Hooks) -> None:
        original = np_random.default_rng
        watch = self

        @functools.wraps(original)
        def default_rng(seed: Any = None) -> Any:
            if seed is None and watch._mine():
                site = user_site(sys._getframe(1))
                if site != "":
                    source = watch.source("numpy_generator")
                    source.uses += 1
                    source.unseeded_uses += 1
                    if site and site not in source.sites and len(source.sites) < SITES_KEPT:
                        source.sites.append(site)
            return original(seed)

        hooks.patch(np_random, "default_rng", default_rng)

    # -- DataLoader workers --------------------------------------------------------------------
    def _patch_workers(self, torch: Any, hooks: Hooks) -> None:
        loader_cls = torch.utils.data.DataLoader
        original = loader_cls.__dict__["_get_iterator"]
        watch = self

        def _get_iterator(loader: Any) -> Any:
            if watch._mine() and int(getattr(loader, "num_workers", 0) or 0) > 0:
                # each worker seeds random, NumPy and torch from a base seed drawn from the
                # loader's generator, or from torch's global one when it has none
                seeded = loader.generator is not None or watch.source("torch_cpu").seeded
                source = watch.source("dataloader_workers")
                source.uses += 1
                if not seeded:
                    source.unseeded_uses += 1
                    site = user_site(sys._getframe(1))
                    if site and site not in source.sites and len(source.sites) < SITES_KEPT:
                        source.sites.append(site)
            return original(loader)

        hooks.patch(loader_cls, "_get_iterator", _get_iterator)

    # -- torch ops (from the repro mode's function mode) ----------------------------------------
    def torch_op(
        self,
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        result: Any,
        site: str | None,
    ) -> None:
        cuda = _on_cuda(result)
        if cuda:
            self.cuda_used = True
            if (
                name in NONDETERMINISTIC_CUDA
                and not self.torch.are_deterministic_algorithms_enabled()
            ):
                self.used("nondeterministic_ops", f"{name} at {site}" if site else name)
            if self.cudnn_benchmark_site is None and self.torch.backends.cudnn.benchmark:
                self.cudnn_benchmark_site = site or "?"
                self.used("cudnn_benchmark", site)
        if name in TORCH_RANDOM and kwargs.get("generator") is None and _draws(name, args, kwargs):
            self.used("torch_cuda" if cuda else "torch_cpu", site)

    def facts(self) -> dict[str, Any]:
        return {
            "sources": {
                name: {
                    "seeded": s.seeded,
                    "uses": s.uses,
                    "unseeded_uses": s.unseeded_uses,
                    "sites": s.sites,
                }
                for name, s in self.sources.items()
            },
            "cuda_used": self.cuda_used,
            "deterministic_algorithms": bool(self.torch.are_deterministic_algorithms_enabled()),
            "cudnn_benchmark": bool(self.torch.backends.cudnn.benchmark),
            "pythonhashseed": os.environ.get("PYTHONHASHSEED"),
            "str_hash": hash("torchdoctor repro"),
        }


def _on_cuda(result: Any) -> bool:
    device = getattr(result, "device", None)
    if device is None and isinstance(result, (tuple, list)) and result:
        device = getattr(result[0], "device", None)
    return getattr(device, "type", None) == "cuda"


def _draws(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """False for a dropout in eval mode or with p=0 (it draws nothing)."""
    if "dropout" not in name:
        return True
    p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
    training = args[2] if len(args) > 2 else kwargs.get("training", True)
    return bool(training) and p != 0
