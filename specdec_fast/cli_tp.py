"""`generate --tp N`: the command line under torchrun, one process per rank (docs/architecture.md §10).

    torchrun --nproc-per-node N -m specdec_fast generate --target DIR --draft DIR --tp N ...

Every rank parses the same flags, joins the process group torchrun describes (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR / MASTER_PORT: NCCL with one GPU per rank where CUDA is present, else
gloo on the CPU), reads only its slices of the target (ShardedCausalLM.from_pretrained), loads
the whole draft (replicated; --tp-draft sharded reads its slices too) and makes the same
generate() calls; rank 0 prints and writes, every rank returns the tokens. A --tp that does not
match torchrun's process count is one line on every rank, before any collective.
"""
import datetime
import os
import sys

from .cli_errors import CliError, first_line

TP_DRAFT = ("replicated", "sharded")
DEFAULT_TP_TIMEOUT_S = 300  # the group's collective timeout: the bound on a rank that hangs (failures.py)


def add_tp_flags(ap) -> None:
    ap.add_argument("--tp", type=int, default=None, metavar="N",
                    help="tensor parallelism over N ranks: run under torchrun --nproc-per-node N")
    ap.add_argument("--tp-draft", choices=TP_DRAFT, default="replicated",
                    help="with --tp: the draft whole on every rank (default) or sharded like the target")
    ap.add_argument("--tp-timeout", type=float, default=DEFAULT_TP_TIMEOUT_S, metavar="SECONDS",
                    help=f"with --tp: collective timeout (default {DEFAULT_TP_TIMEOUT_S} s)")


def check_tp_args(args, environ=os.environ) -> None:
    """--tp against torchrun's environment (CliError naming the fix)."""
    if args.tp is None:
        if args.tp_draft != "replicated":
            raise CliError("--tp-draft goes with --tp N")
        return
    if args.tp < 1:
        raise CliError(f"--tp must be >= 1, got {args.tp}")
    if not args.tp_timeout > 0:
        raise CliError(f"--tp-timeout must be > 0 seconds, got {args.tp_timeout}")
    world = environ.get("WORLD_SIZE")
    if world is None:
        raise CliError(f"--tp {args.tp} runs one process per rank under torchrun: torchrun --nproc-per-node {args.tp} "
                       f"-m specdec_fast generate ... --tp {args.tp}")
    if int(world) != args.tp:
        raise CliError(f"mismatched world sizes: --tp {args.tp} but torchrun started {world} processes "
                       f"(WORLD_SIZE={world}); give --nproc-per-node {args.tp} or --tp {world}")
    if args.draft is None and args.tp_draft == "sharded":
        raise CliError("--tp-draft sharded needs --draft")


class TensorParallelRun:
    """This rank's share of a --tp run: the process group, the device, the loaders."""

    def __init__(self, args, environ=os.environ):
        import torch
        import torch.distributed as dist

        self.rank, self.size = int(environ.get("RANK", 0)), args.tp
        local = int(environ.get("LOCAL_RANK", 0))
        cuda = torch.cuda.is_available() and (args.device is None or args.device.startswith("cuda"))
        per_node, gpus = int(environ.get("LOCAL_WORLD_SIZE", self.size)), torch.cuda.device_count() if cuda else 0
        if cuda and gpus < per_node:  # else rank `gpus` dies in set_device ("invalid device ordinal") and torchrun
            raise CliError(f"--tp {self.size}: {per_node} ranks on this machine need a GPU each, and it has {gpus}; "
                           f"start at most {gpus} per machine, or run the ranks on the CPU with --device cpu")
        self.device = torch.device("cuda", local) if cuda else torch.device(args.device or "cpu")
        if cuda:
            torch.cuda.set_device(self.device)
        self.timeout = datetime.timedelta(seconds=args.tp_timeout)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo", timeout=self.timeout)
        self.main = self.rank == 0
        self._groups = []  # the models' tensor-parallel groups, closed in order at the end
        self._stdout = None
        if not self.main:  # rank 0 prints and writes; the others' output goes nowhere (errors still show)
            self._stdout, sys.stdout = sys.stdout, open(os.devnull, "w")  # noqa: SIM115 - closed in close()

    def load(self, path: str, flag: str, dtype=None, sharded: bool = True):
        """The model in ``path``: this rank's slices (sharded) or the whole model."""
        from .runners.sharded_model import ShardedCausalLM

        try:
            if sharded:
                model = ShardedCausalLM.from_pretrained(path, None, dtype=_dtype(dtype), device=self.device,
                                                        timeout=self.timeout)
                self._groups.append(model.tp)
                return model
            from transformers import AutoModelForCausalLM

            kwargs = {} if dtype is None else {"dtype": dtype}
            return AutoModelForCausalLM.from_pretrained(path, **kwargs).to(self.device).eval()
        except (OSError, ValueError) as exc:
            raise CliError(f"could not load a model from {path} ({flag}): {first_line(exc)}") from None

    def output_path(self, path):
        """Rank 0 writes the data set's results; the others write nowhere."""
        return path if self.main else os.devnull

    def close(self) -> None:
        """The engines, then each model's group, then the default group: in that order (left to
        interpreter exit, gloo's teardown sometimes aborted: "terminate called without an active
        exception", 1 run in 4 of a data set with a sharded draft)."""
        import gc

        import torch.distributed as dist

        from .engine.cached import release_engines

        if self._stdout is not None:
            sys.stdout.close()
            sys.stdout, self._stdout = self._stdout, None
        release_engines()
        for group in self._groups:
            group.close("the run ended")
        self._groups.clear()
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()


def _dtype(name):
    import torch

    return None if name in (None, "auto") else getattr(torch, name)
