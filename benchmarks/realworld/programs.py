"""The public training programs of the scorecard: where each comes from, how it is run
(tiny settings, CPU), the synthetic data it is given, and how many steps it takes.

Nothing here is the programs' code: `python benchmarks/realworld.py --populate` reads the
files named here, at the commit named here, from local mirrors of the repositories (the
search tool's `fetch`, /work/.mirror/<owner>+<name>/repo) into the cache.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import data

EXAMPLES = ("pytorch/examples", "77f55b912142e11fcfdf5b530231fb9c52f181e8")
NANOGPT = ("karpathy/nanoGPT", "3adf61e154c3fe3fca428ad6bc3818b27a3b8291")
MINGPT = ("karpathy/minGPT", "37baab71b9abea1b76ab957409a1cc2fbfba8a26")
LIGHTNING = ("Lightning-AI/pytorch-lightning", "7f0c3436cd3f6ad3753125672024fc415cbcb414")
HF_GPT2 = ("marinVcq/GPT2-trainer", "62eb6f61d8c18df4d6646e0dfebddec0606b9e8a")
LIGHTNING_GAN = "examples/pytorch/domain_templates/generative_adversarial_net.py"
FABRIC_LM = "examples/fabric/language_model/train.py"
FABRIC_KFOLD = "examples/fabric/kfold_cv/train_fabric.py"


@dataclass(frozen=True)
class Patch:
    """A textual change to one file of a program: `old` must occur exactly once."""

    file: str
    old: str
    new: str


@dataclass(frozen=True)
class Run:
    """What a finished run left, for the expected step count."""

    workdir: Path  # the run's cwd
    stdout: str
    counter: int  # lines the shims appended to REALWORLD_COUNTER


@dataclass(frozen=True)
class Program:
    name: str
    repo: str
    commit: str
    files: tuple[str, ...]  # paths in the repository, copied as they are
    workdir: str  # the run's cwd, relative to the program's root in the cache
    script: str  # relative to workdir
    args: tuple[str, ...]
    expected_steps: Callable[[Run], int]  # optimizer steps of the primary optimizer
    # optimizers that must each have rows in python.optimizer_steps (a run of one optimizer has
    # its updates in python.steps only: 0)
    optimizers: int = 0
    data: Callable[[Path], None] | None = None  # writes the synthetic data, once
    data_note: str = ""
    env: dict[str, str] = field(default_factory=dict)
    shims: tuple[str, ...] = ()  # folders of benchmarks/realworld/shims/ put on PYTHONPATH
    pythonpath: tuple[str, ...] = ()  # extra dirs relative to the program's root
    timing: tuple[str, ...] = ()  # regexes of the program's own timing fields in stdout
    # Files whose bytes differ between two plain runs (said why where it is set): compared
    # by presence only.
    unstable_files: tuple[str, ...] = ()
    port: tuple[Patch, ...] = ()  # adaptations to this environment, said in the scorecard
    # The program's own bugs, fixed for every run but the as-is one of the scorecard's "Real
    # bugs" section (bugs.py REAL_BUGS): a healthy run is one without them.
    fixes: tuple[Patch, ...] = ()
    # Regexes of parts of written files' paths that differ between two plain runs (a time in
    # a folder's name; said why where it is set): replaced by <unstable> before comparing.
    unstable_names: tuple[str, ...] = ()
    # 0: `python script ARGS`; N > 0: a torchrun job of N ranks on this machine
    # (`python -m torch.distributed.run --nproc-per-node N ...`), run under torchdoctor with
    # TORCHDOCTOR=1 and TORCHDOCTOR_RUN_DIR; every rank must record expected_steps steps.
    ranks: int = 0
    needs: tuple[str, ...] = ()  # modules that must import, else the program is skipped
    timeout: int = 300
    # The arguments of a run on a CUDA GPU (`realworld.py --device cuda`), made from the CPU
    # run's; None: the program runs on the CPU only (a 2-rank job needs two GPUs, say).
    gpu: Callable[[tuple[str, ...]], tuple[str, ...]] | None = None

    def args_on(self, device: str, args: tuple[str, ...]) -> tuple[str, ...]:
        if device == "cpu":
            return args
        if self.gpu is None:
            raise ValueError(f"{self.name} runs on the CPU only")
        return self.gpu(args)

    @property
    def healthy(self) -> tuple[Patch, ...]:
        """The patches of a healthy run: the ports, then the fixes of the program's bugs."""
        return self.port + self.fixes


def _without(flag: str) -> Callable[[tuple[str, ...]], tuple[str, ...]]:
    return lambda args: tuple(a for a in args if a != flag)


def _with(flag: str) -> Callable[[tuple[str, ...]], tuple[str, ...]]:
    return lambda args: (*args, flag)


def _swapped(old: str, new: str) -> Callable[[tuple[str, ...]], tuple[str, ...]]:
    return lambda args: tuple(new if a == old else a for a in args)


def _as_is(args: tuple[str, ...]) -> tuple[str, ...]:
    """The program takes the GPU by itself when there is one."""
    return args


def _const(n: int) -> Callable[[Run], int]:
    return lambda run: n


def _printed(pattern: str) -> Callable[[Run], int]:
    def count(run: Run) -> int:
        m = re.search(pattern, run.stdout)
        return int(m.group(1)) if m else -1

    return count


def _word_lm_batches(run: Run) -> int:
    """Batches per epoch of word_language_model: tokens (words + one <eos> a line) cut into
    batch_size columns, then bptt-long chunks; two epochs."""
    text = (run.workdir / "data" / "synthetic" / "train.txt").read_text()
    tokens = sum(len(line.split()) + 1 for line in text.splitlines())
    rows = tokens // 20
    return 2 * len(range(0, rows - 1, 20))


def _lightning_batches(run: Run) -> int:
    """transformer.py: WikiText2 blocks of 35 tokens (words + one <eos> a line), 4,000 of them
    held out, batches of 20, one epoch."""
    text = (run.workdir / "data" / "wikitext-2.txt").read_text()
    tokens = sum(len(line.split()) + 1 for line in text.splitlines())
    train = tokens // 35 - 1 - 4000
    return -(-train // 20)


def _hf_global_step(run: Run) -> int:
    """The Trainer's own count: its final checkpoint is checkpoint-<global_step>."""
    found = sorted((run.workdir / "gpt2-small-finetuned").glob("checkpoint-*"))
    return int(found[-1].name.split("-")[1]) if found else -1


def _examples(directory: str, *names: str) -> tuple[str, ...]:
    return tuple(f"{directory}/{n}" for n in names)


NANOGPT_ARGS = (
    "--device=cpu",
    "--dtype=float32",
    "--dataset=synthetic_char",
    "--n_layer=2",
    "--n_head=2",
    "--n_embd=64",
    "--block_size=64",
    "--batch_size=12",
    "--gradient_accumulation_steps=1",
    "--eval_interval=20",
    "--eval_iters=5",
    "--warmup_iters=5",
    "--learning_rate=1e-3",
    "--dropout=0.0",
    "--out_dir=out",
)


def _nanogpt_data(root: Path) -> None:
    data.char_bins(root, "data/synthetic_char", train_chars=200_000, val_chars=20_000)


def _mnist_env(train: int = 1920) -> dict[str, str]:
    return {"REALWORLD_MNIST_TRAIN": str(train), "REALWORLD_MNIST_TEST": "500"}


# pytorch/examples' distributed examples ask for two GPUs; on CPU they run as 2 gloo ranks.
_GPU_CHECK = "if not verify_min_gpu_count(min_gpus=_min_gpu_count):"
_CPU_OK = (
    "if torch.accelerator.is_available() and not verify_min_gpu_count(min_gpus=_min_gpu_count):"
)
DDP_TUTORIAL = "distributed/ddp-tutorial-series/multigpu_torchrun.py"
FSDP2 = "distributed/FSDP2/example.py"
TP = "distributed/tensor_parallelism/tensor_parallel_example.py"
SP = "distributed/tensor_parallelism/sequence_parallel_example.py"
LOG_UTILS_TIME = r"\d\d/\d\d/\d{4} \d\d:\d\d:\d\d [AP]M"  # log_utils' "%m/%d/%Y %I:%M:%S %p"


def _on_cpu(script: str) -> tuple[Patch, ...]:
    """A tensor_parallelism example on this machine: no GPU count to meet, and no accelerator
    (current_accelerator() is None here)."""
    return (
        Patch(script, _GPU_CHECK, _CPU_OK),
        Patch(
            script,
            "device_type = torch.accelerator.current_accelerator().type",
            'device_type = "cpu"',
        ),
    )


def _tensor_parallelism(name: str, path: str, data_note: str) -> Program:
    """A 2-rank example of pytorch/examples' distributed/tensor_parallelism, 10 steps, on CPU,
    with its own bug fixed for the healthy run: its loop never clears the gradients."""
    directory, script = path.rsplit("/", 1)
    return Program(
        name=name,
        repo=EXAMPLES[0],
        commit=EXAMPLES[1],
        files=_examples(directory, script, "log_utils.py"),
        workdir=directory,
        script=script,
        args=(),
        ranks=2,
        expected_steps=_const(10),
        data_note=data_note,
        port=_on_cpu(path),
        fixes=(
            Patch(
                path, "    optimizer.step()\n", "    optimizer.step()\n    optimizer.zero_grad()\n"
            ),
        ),
        timing=(LOG_UTILS_TIME,),
        timeout=600,
    )


PROGRAMS: tuple[Program, ...] = (
    Program(
        name="mnist",
        shims=("vision",),
        repo=EXAMPLES[0],
        commit=EXAMPLES[1],
        files=_examples("mnist", "main.py"),
        workdir="mnist",
        script="main.py",
        args=("--epochs", "1", "--no-accel"),
        expected_steps=_const(30),
        env=_mnist_env(),
        data_note="torchvision stand-in: MNIST of 1,920 / 500 28x28 images, class templates "
        "plus noise",
        gpu=_without("--no-accel"),
    ),
    Program(
        name="dcgan",
        shims=("vision",),
        repo=EXAMPLES[0],
        commit=EXAMPLES[1],
        files=_examples("dcgan", "main.py"),
        workdir="dcgan",
        script="main.py",
        args=(
            "--dataset",
            "fake",
            "--manualSeed",
            "1",
            "--niter",
            "1",
            "--batchSize",
            "50",
            "--ngf",
            "8",
            "--ndf",
            "8",
            "--nz",
            "16",
            "--workers",
            "2",
            "--outf",
            "out",
        ),
        expected_steps=_const(20),
        optimizers=2,
        data_note="torchvision stand-in: FakeData (1,000 random 64x64 images); save_image "
        "writes raw bytes",
        gpu=_with("--accel"),
    ),
    Program(
        name="word_language_model",
        repo=EXAMPLES[0],
        commit=EXAMPLES[1],
        files=_examples("word_language_model", "main.py", "data.py", "model.py"),
        workdir="word_language_model",
        script="main.py",
        args=(
            "--data",
            "data/synthetic",
            "--epochs",
            "2",
            "--emsize",
            "32",
            "--nhid",
            "32",
            "--bptt",
            "20",
            "--batch_size",
            "20",
            "--log-interval",
            "10",
        ),
        expected_steps=_word_lm_batches,
        optimizers=0,  # plain SGD written out: p.data.add_(p.grad, alpha=-lr)
        data=lambda root: data.word_corpus(
            root, "word_language_model/data/synthetic", train=12_000, valid=1_500, test=1_500
        ),
        data_note="a Markov-chain text of 120 words (12,000 / 1,500 / 1,500 words)",
        timing=(r"ms/batch\s+[\d.]+", r"time:\s+[\d.]+s"),
        gpu=_with("--accel"),
    ),
    Program(
        name="reinforce",
        shims=("gym",),
        repo=EXAMPLES[0],
        commit=EXAMPLES[1],
        files=_examples("reinforcement_learning", "reinforce.py"),
        workdir="reinforcement_learning",
        script="reinforce.py",
        args=("--log-interval", "10"),
        expected_steps=lambda run: run.counter - 1,  # one step per episode; 1 seeding reset
        env={"REALWORLD_CARTPOLE_THRESHOLD": "60", "REALWORLD_CARTPOLE_MAX_STEPS": "200"},
        data_note="gymnasium stand-in: CartPole-v1 from its equations; solved at a running "
        "reward of 60 (episodes of at most 200 steps)",
    ),
    Program(
        name="actor_critic",
        shims=("gym",),
        repo=EXAMPLES[0],
        commit=EXAMPLES[1],
        files=_examples("reinforcement_learning", "actor_critic.py"),
        workdir="reinforcement_learning",
        script="actor_critic.py",
        args=("--log-interval", "10"),
        # one step per episode; 1 seeding reset. Its episodes grow from ~10 moves to ~100 as it
        # learns, and its summed loss and gradient norm with them (diagnose/rollout.py)
        expected_steps=lambda run: run.counter - 1,
        env={"REALWORLD_CARTPOLE_THRESHOLD": "60", "REALWORLD_CARTPOLE_MAX_STEPS": "200"},
        data_note="gymnasium stand-in: CartPole-v1 from its equations; solved at a running "
        "reward of 60 (episodes of at most 200 steps)",
    ),
    Program(
        name="mnist_hogwild",
        shims=("vision",),
        repo=EXAMPLES[0],
        commit=EXAMPLES[1],
        files=_examples("mnist_hogwild", "main.py", "train.py"),
        workdir="mnist_hogwild",
        script="main.py",
        # one training child: with two, their lock-free updates of the shared model race, and
        # two plain runs already print different losses
        args=("--epochs", "1", "--num-processes", "1"),
        # The training runs in a child of torch.multiprocessing (spawn), not a rank: not
        # followed, so the launcher records no step (its summary names the children's CPU).
        expected_steps=_const(0),
        env=_mnist_env(),
        # the child prints its pid first on each line: different in every run, as a time is
        timing=(r"(?m)^\d+(?=\tTrain Epoch)",),
        data_note="torchvision stand-in: MNIST of 1,920 / 500 images; trains in a spawned "
        "child process",
    ),
    Program(
        name="mnist_rnn",
        shims=("vision",),
        repo=EXAMPLES[0],
        commit=EXAMPLES[1],
        files=_examples("mnist_rnn", "main.py"),
        workdir="mnist_rnn",
        script="main.py",
        # Its Dropout2d on 2-D input warns once: under the eval call's dropout watch the
        # warning named torchdoctor's file and was shown twice (telemetry/as_caller.py)
        args=("--epochs", "1", "--log-interval", "10", "--save-model"),
        expected_steps=_const(30),
        env=_mnist_env(),
        data_note="torchvision stand-in: MNIST of 1,920 / 500 images, read row by row by an LSTM",
        gpu=_with("--accel"),
    ),
    Program(
        name="siamese_network",
        shims=("vision",),
        repo=EXAMPLES[0],
        commit=EXAMPLES[1],
        files=_examples("siamese_network", "main.py"),
        workdir="siamese_network",
        script="main.py",
        # A ResNet-18 run twice a step (one image of each pair), Adadelta at lr 1.0, the pairs
        # drawn by Python's random in __getitem__; raw 0-255 pixels, no transform.
        args=("--epochs", "1", "--no-accel", "--save-model"),
        expected_steps=_const(15),
        env=_mnist_env(train=960),
        data_note="torchvision stand-in: MNIST of 960 / 500 images and an untrained "
        "ResNet-18 written for the stand-in (the program asks for weights=None)",
        # Its pairs come from Python's random, which nothing seeds: two plain runs print other
        # losses. Seeded from the program's own --seed, so that a run can be compared.
        port=(
            Patch(
                "siamese_network/main.py",
                "    torch.manual_seed(args.seed)\n",
                "    torch.manual_seed(args.seed)\n    random.seed(args.seed)\n",
            ),
        ),
        gpu=_without("--no-accel"),
    ),
    Program(
        name="imagenet",
        shims=("vision",),
        repo=EXAMPLES[0],
        commit=EXAMPLES[1],
        files=_examples("imagenet", "main.py"),
        workdir="imagenet",
        script="main.py",
        # --dummy: FakeData; a ResNet-18 with SGD, a StepLR, 2 loader workers, a validation
        # pass and its checkpoint (checkpoint.pth.tar, copied to model_best.pth.tar)
        args=(
            "--dummy",
            "--no-accel",
            "--epochs",
            "1",
            "-b",
            "16",
            "-j",
            "2",
            "-p",
            "5",
            "--seed",
            "0",
        ),
        expected_steps=_const(10),
        # its ProgressMeter prints each batch's time and data-loading time
        timing=(r"(?<=Time )\s*[\d.]+ \(\s*[\d.]+\)", r"(?<=Data )\s*[\d.]+ \(\s*[\d.]+\)"),
        data_note="torchvision stand-in: FakeData of 160 / 64 images of 3x64x64 (the program "
        "asks for 1,281,167 / 50,000 of 3x224x224) and the stand-in's untrained ResNet-18",
        port=(
            Patch(
                "imagenet/main.py",
                "datasets.FakeData(1281167, (3, 224, 224), 1000",
                "datasets.FakeData(160, (3, 64, 64), 1000",
            ),
            Patch(
                "imagenet/main.py",
                "datasets.FakeData(50000, (3, 224, 224), 1000",
                "datasets.FakeData(64, (3, 64, 64), 1000",
            ),
        ),
        gpu=_without("--no-accel"),
    ),
    Program(
        name="time_sequence_prediction",
        shims=("plot",),
        repo=EXAMPLES[0],
        commit=EXAMPLES[1],
        files=_examples("time_sequence_prediction", "train.py"),
        workdir="time_sequence_prediction",
        script="train.py",
        # LBFGS: each step() calls the closure up to 20 times, each a forward of two LSTMCells
        # unrolled over the sequence and a backward; one step per step()
        args=("--steps", "2"),
        expected_steps=_const(2),
        # Its bug (bugs.py REAL_BUGS tsp_load_weights_only): torch.load of its own NumPy data
        # under torch >= 2.6's weights_only=True fails before training.
        fixes=(
            Patch(
                "time_sequence_prediction/train.py",
                "torch.load('traindata.pt')",
                "torch.load('traindata.pt', weights_only=False)",
            ),
        ),
        data=lambda root: data.sine_waves(
            root, "time_sequence_prediction/traindata.pt", waves=100, length=200
        ),
        data_note="100 sine waves of 200 points (the program's own generator makes 1,000); "
        "matplotlib stand-in: a figure is a file of the values plotted",
    ),
    Program(
        name="mnist_forward_forward",
        shims=("vision",),
        repo=EXAMPLES[0],
        commit=EXAMPLES[1],
        files=_examples("mnist_forward_forward", "main.py"),
        workdir="mnist_forward_forward",
        script="main.py",
        # Hinton's forward-forward: no backward through the network; each of the two layers
        # has its own Adam and is trained alone for all its epochs on one batch (the whole
        # training set), the first layer's epochs before the second's. The layers sit in a
        # Python list, so the Net has no parameters of its own, and Net.train() is the
        # program's training, not nn.Module.train.
        args=(
            *("--epochs", "60", "--train_size", "1000", "--test_size", "500"),
            *("--log-interval", "10", "--no_accel"),
        ),
        # The first layer's 60 updates, then the second layer's 60 once its optimizer has
        # taken over (docs/architecture.md, "What a step is"; its first updates, before it was
        # known to be a phase of its own, are steps too).
        expected_steps=_const(60 + 60),
        optimizers=2,
        env=_mnist_env(1000),
        data_note="torchvision stand-in: MNIST of 1,000 / 500 images, each set one batch",
        # It parses --seed and never seeds: with this torch's random default seed two plain
        # runs differ. Seeded with its own default so that the runs can be compared.
        port=(
            Patch(
                "mnist_forward_forward/main.py",
                "    args = parser.parse_args()\n",
                "    args = parser.parse_args()\n    torch.manual_seed(args.seed)\n",
            ),
        ),
        gpu=_without("--no_accel"),
    ),
    Program(
        name="vae",
        shims=("vision",),
        repo=EXAMPLES[0],
        commit=EXAMPLES[1],
        files=_examples("vae", "main.py", "results/.gitignore"),
        workdir="vae",
        script="main.py",
        args=("--epochs", "1", "--no-accel"),
        expected_steps=_const(30),
        env=_mnist_env(3840),
        data_note="torchvision stand-in: MNIST of 3,840 / 500 images",
        gpu=_without("--no-accel"),
    ),
    Program(
        name="gcn",
        shims=("net",),
        repo=EXAMPLES[0],
        commit=EXAMPLES[1],
        files=_examples("gcn", "main.py"),
        workdir="gcn",
        script="main.py",
        # Full-batch: every step is the whole graph (sparse features and adjacency), then an
        # evaluation of the training and validation nodes inside the same iteration.
        args=("--epochs", "100", "--no-accel"),
        expected_steps=_const(100),
        timing=(r"\(\d+\.\d+s\)",),  # each printed epoch's seconds
        data=lambda root: data.cora(
            root, "gcn/cora", nodes=1800, features=200, classes=7, edges=4000
        ),
        data_note="a Cora-shaped citation graph of 1,800 papers, 200 words, 7 classes and "
        "4,000 citations (Cora: 2,708, 1,433, 7, 5,429); the split takes 1,000 test and 500 "
        "validation nodes, as the program's does",
        # It downloads Cora on every run, whether there or not: the data is in place instead.
        port=(
            Patch(
                "gcn/main.py",
                "    with requests.get(cora_url, stream=True) as tgz_file:\n"
                "        with tarfile.open(fileobj=tgz_file.raw, mode='r:gz') as tgz_object:\n"
                "            tgz_object.extractall()\n",
                "",
            ),
        ),
        gpu=_without("--no-accel"),
    ),
    Program(
        name="gat",
        shims=("net",),
        repo=EXAMPLES[0],
        commit=EXAMPLES[1],
        files=_examples("gat", "main.py"),
        workdir="gat",
        script="main.py",
        # Full-batch graph attention: one update per epoch, then two evaluations in no_grad
        # inside the same function. Dense attention over every pair of nodes; smaller than
        # the paper's (8 heads of 64) so that an epoch takes a fraction of a second here.
        args=(
            *("--epochs", "30", "--num-heads", "2", "--hidden-dim", "16", "--val-every", "5"),
            "--no-accel",
        ),
        expected_steps=_const(30),
        timing=(r"\(\d+\.\d+s\)",),  # each printed epoch's seconds
        # It reads ./cora when both files are there (no download); the split takes 1,200 test
        # and 400 validation nodes, so the graph needs more than 1,600.
        data=lambda root: data.cora(
            root, "gat/cora", nodes=1800, features=200, classes=7, edges=4000
        ),
        data_note="the same Cora-shaped graph as gcn's (1,800 papers, 200 words, 7 classes, "
        "4,000 citations); 200 nodes left for training after the program's split",
        gpu=_without("--no-accel"),
    ),
    Program(
        name="regression",
        repo=EXAMPLES[0],
        commit=EXAMPLES[1],
        files=_examples("regression", "main.py"),
        workdir="regression",
        script="main.py",
        args=(),
        expected_steps=_printed(r"after (\d+) batches"),
        optimizers=0,  # the update is written out: param.data.add_(-0.1 * param.grad)
        data_note="none (the program draws its own polynomial)",
        # Unseeded, and this torch seeds its default generator at random: two plain runs
        # differ. Seeded so that the runs can be compared.
        port=(
            Patch(
                "regression/main.py", "POLY_DEGREE = 4\n", "POLY_DEGREE = 4\ntorch.manual_seed(0)\n"
            ),
        ),
    ),
    Program(
        name="nanogpt",
        repo=NANOGPT[0],
        commit=NANOGPT[1],
        files=("train.py", "model.py", "configurator.py"),
        workdir=".",
        script="train.py",
        args=(*NANOGPT_ARGS, "--compile=False", "--max_iters=40", "--lr_decay_iters=40"),
        expected_steps=_const(41),  # iterations 0..max_iters
        data=_nanogpt_data,
        data_note="data/synthetic_char/{train,val}.bin and meta.pkl: characters of a Markov "
        "text (200,000 / 20,000)",
        timing=(r"time [\d.]+ms", r"mfu -?[\d.]+%"),
        gpu=_swapped("--device=cpu", "--device=cuda"),
    ),
    Program(
        name="nanogpt_compile",
        repo=NANOGPT[0],
        commit=NANOGPT[1],
        files=("train.py", "model.py", "configurator.py"),
        workdir=".",
        script="train.py",
        args=(*NANOGPT_ARGS, "--compile=True", "--max_iters=20", "--lr_decay_iters=20"),
        expected_steps=_const(21),
        data=_nanogpt_data,
        data_note="as nanogpt; torch.compile (inductor, CPU)",
        # Inductor's CPU kernels are not bitwise reproducible here: two plain runs write
        # different weights (the printed losses agree to 4 decimals).
        unstable_files=("out/ckpt.pt",),
        timing=(r"time [\d.]+ms", r"mfu -?[\d.]+%"),
        timeout=600,
        gpu=_swapped("--device=cpu", "--device=cuda"),
    ),
    Program(
        name="mingpt_adder",
        repo=MINGPT[0],
        commit=MINGPT[1],
        files=(
            "projects/adder/adder.py",
            "mingpt/__init__.py",
            "mingpt/model.py",
            "mingpt/trainer.py",
            "mingpt/utils.py",
            "mingpt/bpe.py",
        ),
        workdir=".",
        script="projects/adder/adder.py",
        args=(
            "--trainer.max_iters=60",
            "--trainer.num_workers=0",
            "--trainer.batch_size=32",
            "--system.work_dir=out/adder",
        ),
        expected_steps=_const(60),
        pythonpath=(".",),
        data_note="none (the program makes its own additions)",
        timing=(r"iter_dt [\d.]+ms",),
        gpu=_as_is,
    ),
    Program(
        name="hf_trainer_gpt2",
        shims=("hf",),
        repo=HF_GPT2[0],
        commit=HF_GPT2[1],
        files=("main.py",),
        workdir=".",
        script="main.py",
        args=(),
        expected_steps=_hf_global_step,
        data=lambda root: data.tiny_gpt2(root, "gpt2-small", "training_data.txt", words=1_500),
        data_note="./gpt2-small: a local 2-layer GPT-2 (random weights) and a BPE tokenizer "
        "trained on a Markov text; training_data.txt of 1,500 words. Progress bars off "
        "(TQDM_DISABLE=1), hub off (HF_HUB_OFFLINE=1)",
        env={"HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", "TOKENIZERS_PARALLELISM": "false"},
        # Written for transformers 4: two names it uses are gone from transformers 5.
        port=(
            Patch(
                "main.py",
                "from transformers import TextDataset, DataCollatorForLanguageModeling\n",
                "from realworld_compat import TextDataset\n"
                "from transformers import DataCollatorForLanguageModeling\n",
            ),
            Patch("main.py", "    overwrite_output_dir=True,\n", ""),
        ),
        needs=("transformers",),
        timing=(
            r"'train_runtime': '?[\d.]+'?",
            r"'train_samples_per_second': '?[\d.]+'?",
            r"'train_steps_per_second': '?[\d.]+'?",
        ),
        gpu=_as_is,
    ),
    Program(
        name="lightning_transformer",
        shims=("net",),
        repo=LIGHTNING[0],
        commit=LIGHTNING[1],
        files=("examples/pytorch/basics/transformer.py",),
        workdir="examples/pytorch/basics",
        script="transformer.py",
        args=(),
        expected_steps=_lightning_batches,
        data=lambda root: data.single_text(
            root, "examples/pytorch/basics/data/wikitext-2.txt", words=193_900
        ),
        data_note="data/wikitext-2.txt (where lightning.pytorch.demos.WikiText2 looks before "
        "downloading): a Markov text of 193,900 words (6,000 blocks of 35 tokens: 2,000 to "
        "train on, 100 steps)",
        # The script takes no arguments; its size is set in the Trainer call (20 epochs with
        # 100 validation batches each: 7 minutes here), made tiny the way arguments would.
        port=(
            Patch(
                "examples/pytorch/basics/transformer.py",
                "L.Trainer(gradient_clip_val=0.25, max_epochs=20)",
                "L.Trainer(gradient_clip_val=0.25, max_epochs=1, limit_val_batches=5, "
                "limit_test_batches=5)",
            ),
        ),
        needs=("lightning",),
        # COLUMNS: a console wide enough for the progress bar's one line. At rich's default
        # of 80 columns the rate's width (9.8it/s, 10.2it/s) decided whether the remaining
        # time wrapped to the next line, differently from run to run.
        env={"TQDM_DISABLE": "1", "COLUMNS": "200"},
        # Lightning's rich progress bar (stdout): elapsed, remaining, rate, and the bar whose
        # length follows them.
        timing=(r"\d+:\d\d:\d\d", r"[\d.]+it/s", r"━+"),
        timeout=600,
        gpu=_as_is,
    ),
    Program(
        name="fabric_language_model",
        shims=("net",),
        repo=LIGHTNING[0],
        commit=LIGHTNING[1],
        files=(FABRIC_LM,),
        workdir="examples/fabric/language_model",
        script="train.py",
        args=(),
        # Lightning Fabric's way in: fabric.setup() wraps the model and optimizer,
        # fabric.backward(loss) and fabric.clip_gradients() replace their torch calls.
        expected_steps=_lightning_batches,
        data=lambda root: data.single_text(
            root, "examples/fabric/language_model/data/wikitext-2.txt", words=193_900
        ),
        data_note="data/wikitext-2.txt (where lightning.pytorch.demos.WikiText2 looks before "
        "downloading): the Markov text of lightning_transformer (2,000 blocks to train on, 100 "
        "steps; 2,000 to validate on)",
        # Its size is a default argument of train() (20 epochs: 2,000 steps), made one epoch
        # the way an argument would.
        port=(
            Patch(
                FABRIC_LM,
                "val_dataloader, max_epochs=20):",
                "val_dataloader, max_epochs=1):",
            ),
        ),
        needs=("lightning",),
        timeout=600,
        gpu=_as_is,
    ),
    Program(
        name="fabric_kfold",
        shims=("vision", "sklearn"),
        repo=LIGHTNING[0],
        commit=LIGHTNING[1],
        files=(FABRIC_KFOLD,),
        workdir="examples/fabric/kfold_cv",
        script="train_fabric.py",
        # K-fold cross-validation: a model and an Adadelta per fold, all made up front; each
        # epoch trains fold 0's model on its batches, then fold 1's, ..., so the optimizers
        # take turns by the fold, not by the step.
        args=("--epochs", "2", "--folds", "3", "--log-interval", "10"),
        # Every update is a step: 2 epochs x 3 folds x 30 batches (1,920 of the 2,880 images).
        expected_steps=_const(180),
        optimizers=3,
        env=_mnist_env(2880),
        data_note="torchvision stand-in: MNIST of 2,880 images; scikit-learn stand-in: KFold "
        "without shuffling (contiguous folds, as scikit-learn's)",
        needs=("lightning", "torchmetrics"),
        timeout=600,
    ),
    Program(
        name="lightning_gan",
        shims=("net",),
        repo=LIGHTNING[0],
        commit=LIGHTNING[1],
        files=(LIGHTNING_GAN,),
        workdir="examples/pytorch/domain_templates",
        script="generative_adversarial_net.py",
        args=(),
        # Manual optimization: training_step steps the generator's Adam, then the
        # discriminator's, each between toggle_optimizer() and untoggle_optimizer().
        expected_steps=_const(20),
        optimizers=2,
        data=lambda root: data.mnist_processed(
            root, "examples/pytorch/domain_templates/data/MNIST/complete", train=5640, test=100
        ),
        data_note="data/MNIST/complete/{training,test}.pt (Lightning's demo MNIST, read "
        "without torchvision when PL_USE_MOCKED_MNIST is set): 5,640 / 100 28x28 images, class "
        "templates plus noise; MNISTDataModule holds 5,000 out for validation, 640 to train on",
        port=(
            Patch(
                LIGHTNING_GAN,
                'Trainer(accelerator="gpu", devices=1)',
                'Trainer(accelerator="cpu", devices=1, max_epochs=1, limit_train_batches=20, '
                "logger=False)",
            ),
            # Unseeded, and this torch seeds its default generator at random: two plain runs
            # train different weights. Seeded so that the runs can be compared.
            Patch(
                LIGHTNING_GAN,
                "def main(args: Namespace) -> None:\n",
                "def main(args: Namespace) -> None:\n    torch.manual_seed(0)\n",
            ),
            # No torchvision here: the epoch's sample images are made, not gridded (no
            # logger would receive the grid).
            Patch(
                LIGHTNING_GAN,
                "grid = torchvision.utils.make_grid(sample_imgs)",
                "grid = sample_imgs",
            ),
        ),
        needs=("lightning",),
        env={"PL_USE_MOCKED_MNIST": "1", "TQDM_DISABLE": "1", "COLUMNS": "200"},
        timing=(r"\d+:\d\d:\d\d", r"[\d.]+it/s", r"━+"),
        timeout=600,
    ),
    Program(
        name="ddp_tutorial",
        repo=EXAMPLES[0],
        commit=EXAMPLES[1],
        files=_examples("distributed/ddp-tutorial-series", "multigpu_torchrun.py", "datautils.py"),
        workdir="distributed/ddp-tutorial-series",
        script="multigpu_torchrun.py",
        # 1 epoch, a snapshot after it: 2,048 samples, 2 ranks, 32 a batch
        args=("1", "1"),
        ranks=2,
        expected_steps=_const(32),
        data_note="the program's own: 2,048 random (20 values, 1 value) pairs",
        port=(
            # The CPU: gloo instead of NCCL, no device to bind or move to.
            Patch(DDP_TUTORIAL, '    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))\n', ""),
            Patch(DDP_TUTORIAL, 'backend="nccl"', 'backend="gloo"'),
            Patch(DDP_TUTORIAL, "self.model = model.to(self.gpu_id)", "self.model = model"),
            Patch(DDP_TUTORIAL, "DDP(self.model, device_ids=[self.gpu_id])", "DDP(self.model)"),
            Patch(DDP_TUTORIAL, "source = source.to(self.gpu_id)", "source = source"),
            Patch(DDP_TUTORIAL, "targets = targets.to(self.gpu_id)", "targets = targets"),
            # Its data and weights come from an unseeded torch.rand: two plain runs would save
            # other snapshots.
            Patch(
                DDP_TUTORIAL,
                "    train_set = MyTrainDataset(2048)",
                "    torch.manual_seed(0)\n    train_set = MyTrainDataset(2048)",
            ),
        ),
        # Its bug (bugs.py REAL_BUGS ddp_tutorial_one_class): cross_entropy on the one output
        # of a Linear(20, 1) against values in [0, 1): the loss is always 0. Fixed as the
        # regression it is.
        fixes=(
            Patch(
                DDP_TUTORIAL,
                "loss = F.cross_entropy(output, targets)",
                "loss = F.mse_loss(output, targets)",
            ),
        ),
        timeout=600,
    ),
    Program(
        name="fsdp2",
        repo=EXAMPLES[0],
        commit=EXAMPLES[1],
        files=_examples("distributed/FSDP2", "example.py", "model.py", "utils.py", "checkpoint.py"),
        workdir="distributed/FSDP2",
        script="example.py",
        args=(),
        ranks=2,
        expected_steps=_const(10),
        data_note="none (random tokens, seeded)",
        port=(
            # A CPU job of 2 ranks needs no GPU.
            Patch(FSDP2, "    " + _GPU_CHECK, "    " + _CPU_OK),
            # init_process_group refuses a CPU device as device_id (a device to bind NCCL to).
            Patch(
                FSDP2,
                "init_process_group(backend=backend, device_id=device)",
                'init_process_group(backend=backend, device_id=None if device.type == "cpu" '
                "else device)",
            ),
            # 2 of its 10 layers: small and quick, the same code.
            Patch(FSDP2, "n_layers=10,", "n_layers=2,"),
        ),
        # Its bug (bugs.py REAL_BUGS fsdp2_layers_never_initialised): after to_empty(),
        # Transformer.reset_parameters() initialises the root's own modules only; the
        # layers keep the uninitialised memory to_empty() gave them.
        fixes=(
            Patch(
                FSDP2,
                "        model.reset_parameters()\n",
                "        model.reset_parameters()\n"
                "        for layer in model.layers:\n"
                "            layer.reset_parameters()\n",
            ),
        ),
        # Rank 0 saves to checkpoints/dtensor_api/<the time in ms>/ (a resumable run finds
        # its latest by that number): the folder's name differs between any two runs.
        unstable_names=(r"(?<=/checkpoints/dtensor_api/)\d+(?=/)",),
        timeout=600,
    ),
    # Their bug (bugs.py REAL_BUGS tp_no_zero_grad, sp_no_zero_grad): the loops never clear
    # the gradients.
    _tensor_parallelism("tensor_parallel", TP, data_note="none (seeded random inputs)"),
    # Megatron-style sequence parallel: each rank its own rows of the batch (Shard(0)), an
    # all-gather into the column-wise Linear and a reduce-scatter out of the row-wise one.
    _tensor_parallelism(
        "sequence_parallel", SP, data_note="none (random inputs, each rank its own)"
    ),
)


def by_name(name: str) -> Program:
    for p in PROGRAMS:
        if p.name == name:
            return p
    raise KeyError(name)
