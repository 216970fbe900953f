"""Bugs planted in the programs: a small textual patch (or other arguments), and what a
truthful doctor says about it: the kind, the place and the first fix.

Kinds that torchdoctor has no diagnosis for yet are written as the names a fix would use
(`not_in_optimizer`): the scorecard counts them as not found until a diagnosis of one of the
accepted kinds appears. Places are module qualified names (`name.*`: any module under it) or
`file:line` (the line found by its text in the patched file), any one of them right.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .programs import DDP_TUTORIAL, FABRIC_LM, FSDP2, LIGHTNING_GAN, NANOGPT_ARGS, SP, TP, Patch


@dataclass(frozen=True)
class Line:
    """A place given as the line of `file` (relative to the program root) holding `text`,
    after the patches; `nth` picks among several."""

    file: str
    text: str
    nth: int = 0


@dataclass(frozen=True)
class Bug:
    name: str
    program: str
    what: str  # the bug, in words
    kinds: tuple[str, ...]  # accepted diagnosis kinds (warning or error)
    modules: tuple[str, ...] = ()  # right places: qualified module names
    lines: tuple[Line, ...] = ()  # right places: file:line
    fix: str = ""  # a regex the first fix must match (case-insensitive)
    patches: tuple[Patch, ...] = ()
    args: tuple[str, ...] | None = None  # replaces the program's arguments
    env: dict[str, str] = field(default_factory=dict)


NANOGPT_ARGS_TINY_EVAL = tuple(
    "--eval_iters=1" if a.startswith("--eval_iters=") else a for a in NANOGPT_ARGS
)

BUGS: tuple[Bug, ...] = (
    Bug(
        name="mnist_no_zero_grad",
        program="mnist",
        what="optimizer.zero_grad() dropped: gradients pile up across steps",
        kinds=("grad_not_cleared",),
        lines=(
            Line("mnist/main.py", "optimizer.step()"),
            Line("mnist/main.py", "loss.backward()", 0),
        ),
        fix=r"zero_grad",
        patches=(Patch("mnist/main.py", "        optimizer.zero_grad()\n", ""),),
    ),
    Bug(
        name="gcn_no_zero_grad",
        program="gcn",
        what="optimizer.zero_grad() dropped from the full-batch GCN: the whole graph's "
        "gradients pile up, and the norm explodes 35 steps on",
        kinds=("grad_not_cleared",),
        lines=(
            Line("gcn/main.py", "optimizer.step()"),
            Line("gcn/main.py", "loss.backward()"),
        ),
        fix=r"zero_grad",
        patches=(Patch("gcn/main.py", "    optimizer.zero_grad()\n", ""),),
    ),
    Bug(
        name="siamese_trains_in_eval_mode",
        program="siamese_network",
        what="train() begins with model.eval() (the test function's first line, pasted): the "
        "ResNet's 20 batch-norm layers normalise raw 0-255 pixels with their initial running "
        "statistics, and never update them",
        kinds=("eval_mode",),
        lines=(Line("siamese_network/main.py", "model.eval()"),),
        fix=r"\.train\(\)",
        patches=(
            Patch(
                "siamese_network/main.py",
                "optimizer, epoch):\n    model.train()\n",
                "optimizer, epoch):\n    model.eval()\n",
            ),
        ),
    ),
    Bug(
        name="imagenet_scheduler_first",
        program="imagenet",
        what="scheduler.step() moved to the top of the epoch loop, before train(): the "
        "order before PyTorch 1.1, which skips the schedule's first value (torch warns once; "
        "a schedule of 30-epoch steps comes an epoch early)",
        kinds=("scheduler_order",),
        lines=(Line("imagenet/main.py", "scheduler.step()"),),
        fix=r"after optimizer\.step\(\)|after the optimizer",
        patches=(
            Patch(
                "imagenet/main.py",
                "        # train for one epoch\n",
                "        scheduler.step()\n        # train for one epoch\n",
            ),
            Patch("imagenet/main.py", "        \n        scheduler.step()\n", "        \n"),
        ),
    ),
    Bug(
        name="mingpt_no_zero_grad",
        program="mingpt_adder",
        what="model.zero_grad() dropped from minGPT's Trainer",
        kinds=("grad_not_cleared",),
        lines=(
            Line("mingpt/trainer.py", "self.optimizer.step()"),
            Line("mingpt/trainer.py", "self.loss.backward()"),
        ),
        fix=r"zero_grad",
        patches=(
            Patch("mingpt/trainer.py", "            model.zero_grad(set_to_none=True)\n", ""),
        ),
    ),
    Bug(
        name="mnist_lr_zero",
        program="mnist",
        what="learning rate 0 (--lr 0), 120 steps",
        kinds=("lr_zero", "not_learning"),
        lines=(Line("mnist/main.py", "optimizer = optim.Adadelta("),),
        modules=("Adadelta", "optimizer"),
        fix=r"learning rate|\blr\b",
        args=("--epochs", "1", "--no-accel", "--lr", "0"),
        env={"REALWORLD_MNIST_TRAIN": "7680"},
    ),
    Bug(
        name="lightning_lr_zero",
        program="lightning_transformer",
        what="SGD(lr=0.0) in configure_optimizers, 100 steps",
        kinds=("lr_zero", "not_learning"),
        lines=(Line("examples/pytorch/basics/transformer.py", "torch.optim.SGD("),),
        modules=("SGD", "optimizer"),
        fix=r"learning rate|\blr\b",
        patches=(
            Patch(
                "examples/pytorch/basics/transformer.py",
                "torch.optim.SGD(self.parameters(), lr=0.1)",
                "torch.optim.SGD(self.parameters(), lr=0.0)",
            ),
        ),
    ),
    Bug(
        name="dcgan_generator_detached",
        program="dcgan",
        what="the generator's loss computed on fake.detach(): netG never gets a gradient",
        kinds=("no_gradient",),
        modules=("netG",),
        lines=(Line("dcgan/main.py", "output = netD(fake.detach())", 1),),
        fix=r"detach",
        patches=(
            Patch(
                "dcgan/main.py",
                "        output = netD(fake)\n",
                "        output = netD(fake.detach())\n",
            ),
        ),
    ),
    Bug(
        name="mnist_log_zero",
        program="mnist",
        what="torch.log after a ReLU in Net.forward: log(0) = -inf, then NaN",
        kinds=("nan",),
        lines=(Line("mnist/main.py", "x = torch.log(x)"),),
        fix=r"eps|clamp",
        patches=(
            Patch(
                "mnist/main.py",
                "        x = F.relu(x)\n        x = self.dropout2(x)\n",
                "        x = F.relu(x)\n        x = torch.log(x)\n        x = self.dropout2(x)\n",
            ),
        ),
    ),
    Bug(
        name="nanogpt_log_in_mlp",
        program="nanogpt",
        what="torch.log of GELU's output in every block's MLP: NaN from the first block",
        kinds=("nan",),
        modules=("transformer.h.0.mlp",),
        lines=(Line("model.py", "x = torch.log(self.gelu(x))"),),
        fix=r"eps|clamp",
        patches=(
            Patch(
                "model.py", "        x = self.gelu(x)\n", "        x = torch.log(self.gelu(x))\n"
            ),
        ),
    ),
    Bug(
        name="vae_lr_too_high",
        program="vae",
        what="Adam lr=0.5 (500x the example's): the loss runs away, then the BCE input is NaN",
        kinds=("divergence", "nan", "crash"),  # it crashes at step 3: the crash names the lr
        lines=(Line("vae/main.py", "optimizer = optim.Adam("),),
        modules=("Adam", "optimizer"),
        fix=r"learning rate|\blr\b",
        patches=(Patch("vae/main.py", "lr=1e-3)", "lr=0.5)"),),
    ),
    Bug(
        name="nanogpt_slow_get_batch",
        program="nanogpt",
        what="get_batch sleeps 300 ms (a slow data fetch, called between forward and backward)",
        kinds=("dataloader_bound",),
        lines=(
            Line("train.py", "def get_batch(split):"),
            Line("train.py", "X, Y = get_batch('train')", 1),
        ),
        fix=r"data|prefetch|worker",
        patches=(
            Patch(
                "train.py",
                "def get_batch(split):\n",
                "def get_batch(split):\n    time.sleep(0.3)\n",
            ),
        ),
        # 300 ms dwarfs a step here even on a loaded machine; 20 steps, one eval batch.
        args=(*NANOGPT_ARGS_TINY_EVAL, "--compile=False", "--max_iters=20", "--lr_decay_iters=20"),
    ),
    Bug(
        name="mnist_head_only_optimizer",
        program="mnist",
        what="the optimizer holds fc2 only: conv1, conv2, fc1 get gradients, never updates",
        kinds=("not_in_optimizer", "unoptimized_parameters"),
        modules=("conv1", "conv2", "fc1"),
        lines=(Line("mnist/main.py", "optimizer = optim.Adadelta("),),
        fix=r"optimizer",
        patches=(
            Patch(
                "mnist/main.py",
                "optim.Adadelta(model.parameters(), lr=args.lr)",
                "optim.Adadelta(model.fc2.parameters(), lr=args.lr)",
            ),
        ),
    ),
    Bug(
        name="word_lm_loss_detached",
        program="word_language_model",
        what="the loss computed on output.detach(): backward() raises at once",
        kinds=("crash",),
        lines=(
            Line("word_language_model/main.py", "loss.backward()"),
            Line("word_language_model/main.py", "criterion(output.detach(), targets)"),
        ),
        fix=r"detach|requires_grad|no_grad",
        patches=(
            Patch(
                "word_language_model/main.py",
                "        loss = criterion(output, targets)\n",
                "        loss = criterion(output.detach(), targets)\n",
            ),
        ),
    ),
    Bug(
        name="fsdp2_no_zero_grad",
        program="fsdp2",
        what="optim.zero_grad() dropped from the FSDP2 example's loop: sharded gradients pile "
        "up across steps",
        kinds=("grad_not_cleared",),
        lines=(
            Line(FSDP2, "optim.step()"),
            Line(FSDP2, "loss.backward()"),
        ),
        fix=r"zero_grad",
        patches=(Patch(FSDP2, "        optim.zero_grad()\n", ""),),
    ),
    Bug(
        name="tp_log_after_relu",
        program="tensor_parallel",
        what="torch.log of the ReLU's output in ToyModel.forward (between the column- and the "
        "row-parallel layer): log(0) = -inf, then NaN",
        kinds=("nan",),
        modules=("out_proj",),
        lines=(Line(TP, "torch.log(self.relu("),),
        fix=r"eps|clamp",
        patches=(
            Patch(
                TP,
                "return self.out_proj(self.relu(self.in_proj(x)))",
                "return self.out_proj(torch.log(self.relu(self.in_proj(x))))",
            ),
        ),
    ),
    Bug(
        name="lightning_gan_no_zero_grad_g",
        program="lightning_gan",
        what="opt_g.zero_grad() dropped from the manual-optimization training_step: the "
        "generator's gradients pile up across steps",
        kinds=("grad_not_cleared",),
        lines=(
            Line(LIGHTNING_GAN, "opt_g.step()"),
            Line(LIGHTNING_GAN, "self.manual_backward(g_loss)"),
        ),
        fix=r"zero_grad",
        patches=(Patch(LIGHTNING_GAN, "        opt_g.zero_grad()\n", ""),),
    ),
    Bug(
        name="lightning_gan_optimizers_swapped",
        program="lightning_gan",
        what="`opt_d, opt_g = self.optimizers()`, the reverse of configure_optimizers' order: "
        "toggle_optimizer() freezes every parameter outside the optimizer it is given, so the "
        "discriminator's phase runs with the discriminator frozen and the generator's output "
        "detached, and its manual_backward(d_loss) raises 'element 0 of tensors does not "
        "require grad'",
        kinds=("crash",),
        lines=(Line(LIGHTNING_GAN, "self.manual_backward(d_loss)"),),
        modules=("GAN",),
        # the frozen discriminator first (the graph cut of .detach() alone would leave the
        # real images' loss a graph)
        fix=r"unfreeze|toggle_optimizer",
        patches=(
            Patch(
                LIGHTNING_GAN,
                "opt_g, opt_d = self.optimizers()",
                "opt_d, opt_g = self.optimizers()",
            ),
        ),
    ),
    Bug(
        name="fabric_clip_to_zero",
        program="fabric_language_model",
        what="fabric.clip_gradients(..., clip_val=0.0) where 0.25 was meant: every gradient "
        "value is clamped to 0 before optimizer.step(), so SGD never moves a weight",
        kinds=("clip_to_zero",),
        lines=(Line(FABRIC_LM, "fabric.clip_gradients(model, optimizer, clip_val=0.0)"),),
        fix=r"clip",
        patches=(Patch(FABRIC_LM, "clip_val=0.25", "clip_val=0.0"),),
    ),
    Bug(
        name="mnist_step_before_backward",
        program="mnist",
        what="optimizer.step() moved up, between zero_grad() and the forward: every update "
        "runs on gradients zero_grad() just cleared (None), so Adadelta never moves a weight, "
        "and the gradients backward() makes are cleared unused",
        kinds=("no_gradient",),
        lines=(Line("mnist/main.py", "optimizer.step()"),),
        fix=r"after (loss\.)?backward|before (the )?optimizer\.step|backward\(\) (first|before)",
        patches=(
            Patch(
                "mnist/main.py",
                "        optimizer.zero_grad()\n        output = model(data)\n"
                "        loss = F.nll_loss(output, target)\n        loss.backward()\n"
                "        optimizer.step()\n",
                "        optimizer.zero_grad()\n        optimizer.step()\n"
                "        output = model(data)\n        loss = F.nll_loss(output, target)\n"
                "        loss.backward()\n",
            ),
        ),
    ),
    Bug(
        name="forward_forward_no_zero_grad",
        program="mnist_forward_forward",
        what="self.opt.zero_grad() dropped from Layer.train: each layer's gradients pile up "
        "over its epochs on the one batch",
        kinds=("grad_not_cleared",),
        lines=(
            Line("mnist_forward_forward/main.py", "self.opt.step()"),
            Line("mnist_forward_forward/main.py", "loss.backward()"),
        ),
        fix=r"zero_grad",
        patches=(Patch("mnist_forward_forward/main.py", "            self.opt.zero_grad()\n", ""),),
    ),
    Bug(
        name="forward_forward_output_not_detached",
        program="mnist_forward_forward",
        what="Layer.train returns its outputs without .detach(): the second layer's first "
        "backward() also runs through the first layer's graph and frees it, the second goes "
        "through it again (RuntimeError: Trying to backward through the graph a second time)",
        kinds=("crash",),
        lines=(Line("mnist_forward_forward/main.py", "loss.backward()"),),
        modules=("Layer",),
        fix=r"detach|cut the graph",
        patches=(
            Patch(
                "mnist_forward_forward/main.py",
                "        return self.forward(x_pos).detach(), self.forward(x_neg).detach()\n",
                "        return self.forward(x_pos), self.forward(x_neg)\n",
            ),
        ),
    ),
    Bug(
        name="forward_forward_trained_under_no_grad",
        program="mnist_forward_forward",
        what="the training call wrapped in torch.no_grad() (as the evaluation below it is "
        "often written): the first loss has no graph, and backward() raises 'element 0 of "
        "tensors does not require grad'",
        kinds=("crash",),
        lines=(
            Line("mnist_forward_forward/main.py", "loss.backward()"),
            Line("mnist_forward_forward/main.py", "net.train(x_pos, x_neg)"),
        ),
        modules=("Layer",),
        fix=r"no_grad|inference_mode",
        patches=(
            Patch(
                "mnist_forward_forward/main.py",
                "    net.train(x_pos, x_neg)\n",
                "    with torch.no_grad():\n        net.train(x_pos, x_neg)\n",
            ),
        ),
    ),
    Bug(
        name="word_lm_hidden_not_detached",
        program="word_language_model",
        what="hidden = repackage_hidden(hidden) dropped from train(): the LSTM's state carries "
        "the graph of the batch before, so the second backward() goes through its freed graph "
        "(RuntimeError: Trying to backward through the graph a second time)",
        kinds=("crash",),
        lines=(
            Line("word_language_model/main.py", "loss.backward()"),
            Line("word_language_model/main.py", "output, hidden = model(data, hidden)"),
        ),
        modules=("RNNModel", "rnn", "encoder"),
        fix=r"detach|cut the graph",
        patches=(
            Patch(
                "word_language_model/main.py",
                "            hidden = repackage_hidden(hidden)\n            output, hidden = "
                "model(data, hidden)\n",
                "            output, hidden = model(data, hidden)\n",
            ),
        ),
    ),
    Bug(
        name="siamese_sigmoid_into_bce_with_logits",
        program="siamese_network",
        what="the training loss swapped to BCEWithLogitsLoss while the model still ends in a "
        "sigmoid: the loss applies a second sigmoid, squeezing every prediction into "
        "(0.5, 0.73), and the gradients shrink",
        kinds=("loss_inputs",),
        lines=(
            Line("siamese_network/main.py", "loss.backward()"),
            Line("siamese_network/main.py", "criterion = nn.BCEWithLogitsLoss()"),
        ),
        fix=r"sigmoid|BCELoss|logits",
        patches=(
            Patch(
                "siamese_network/main.py",
                "    model.train()\n\n    # we aren't using `TripletLoss` as the MNIST dataset is "
                "simple, so `BCELoss` can do the trick.\n    criterion = nn.BCELoss()\n",
                "    model.train()\n\n    # we aren't using `TripletLoss` as the MNIST dataset is "
                "simple, so `BCELoss` can do the trick.\n    criterion = nn.BCEWithLogitsLoss()\n",
            ),
        ),
    ),
    Bug(
        name="nanogpt_accumulation_not_divided",
        program="nanogpt",
        what="with 4 micro-batches per update, `loss = loss / gradient_accumulation_steps` "
        "dropped: the update applies the sum of 4 micro-batch gradients, 4x the step size "
        "the learning rate was tuned for",
        kinds=("accumulation",),
        lines=(Line("train.py", "scaler.scale(loss).backward()"),),
        fix=r"divide|/ ?gradient_accumulation|accumulation steps|micro-batch",
        args=(
            *(
                "--gradient_accumulation_steps=4" if a.startswith("--gradient_accumulation") else a
                for a in NANOGPT_ARGS_TINY_EVAL
            ),
            "--compile=False",
            "--max_iters=12",
            "--lr_decay_iters=12",
        ),
        patches=(
            Patch(
                "train.py",
                "            loss = loss / gradient_accumulation_steps # scale the loss to "
                "account for gradient accumulation\n",
                "",
            ),
        ),
    ),
    Bug(
        name="hf_trainer_model_frozen",
        program="hf_trainer_gpt2",
        what="model.requires_grad_(False) after from_pretrained (meant for the embeddings "
        "alone): no parameter trains, the loss has no graph, and the Trainer's backward() "
        "raises 'element 0 of tensors does not require grad'",
        kinds=("crash",),
        lines=(
            Line("main.py", "model.requires_grad_(False)"),
            Line("main.py", "trainer.train()"),
        ),
        fix=r"requires_grad|unfreeze|freez",
        patches=(
            Patch(
                "main.py",
                "model = GPT2LMHeadModel.from_pretrained(model_name)\n",
                "model = GPT2LMHeadModel.from_pretrained(model_name)\n"
                "model.requires_grad_(False)\n",
            ),
        ),
    ),
    Bug(
        name="ddp_tutorial_no_distributed_sampler",
        program="ddp_tutorial",
        what="the DataLoader's DistributedSampler left out (and its set_epoch call with it): "
        "both ranks read the whole dataset in the same order, so the two DDP replicas average "
        "gradients of identical batches and the job does the work of one rank",
        kinds=("same_batches",),
        # where the DataLoader is made, or where the rank first iterates it (the finding names
        # that line and the loader's sampler class: torch keeps no record of where a
        # DataLoader was built)
        lines=(
            Line(DDP_TUTORIAL, "return DataLoader("),
            Line(DDP_TUTORIAL, "b_sz = len(next(iter(self.train_data))[0])"),
            Line(DDP_TUTORIAL, "for source, targets in self.train_data:"),
        ),
        fix=r"DistributedSampler",
        patches=(
            Patch(
                DDP_TUTORIAL,
                "        shuffle=False,\n        sampler=DistributedSampler(dataset)\n",
                "        shuffle=False,\n",
            ),
            Patch(DDP_TUTORIAL, "        self.train_data.sampler.set_epoch(epoch)\n", ""),
        ),
    ),
    Bug(
        name="gat_softmax_into_nll",
        program="gat",
        what="GAT.forward returns F.softmax instead of F.log_softmax, and the loss is "
        "NLLLoss: it takes probabilities for log-probabilities (the loss is -p, it still "
        "falls)",
        kinds=("loss_inputs",),
        lines=(
            Line("gat/main.py", "return F.softmax(x, dim=1)"),
            Line("gat/main.py", "loss = criterion(output[mask_train]"),
            Line("gat/main.py", "loss.backward()"),  # where the loss's graph is read
        ),
        fix=r"log_softmax",
        patches=(
            Patch("gat/main.py", "return F.log_softmax(x, dim=1)", "return F.softmax(x, dim=1)"),
        ),
    ),
    Bug(
        name="gat_train_mode_dropped",
        program="gat",
        what="model.train() dropped from train_iter: after the first epoch's evaluation "
        "(model.eval()) the model trains in eval mode, its functional dropout "
        "(training=self.training) off",
        kinds=("eval_mode",),
        lines=(
            Line("gat/main.py", "model.eval()"),
            Line("gat/main.py", "output = model(*input)"),
        ),
        fix=r"\.train\(\)",
        patches=(Patch("gat/main.py", "    model.train()\n", ""),),
    ),
    Bug(
        name="gat_dropout_always_on",
        program="gat",
        what="the attention's F.dropout without training=self.training: dropout runs in "
        "evaluation too (F.dropout's default is training=True), so validation and test "
        "scores are noisy and low",
        kinds=("dropout_in_eval",),
        lines=(Line("gat/main.py", "attention = F.dropout(attention, self.dropout)"),),
        fix=r"self\.training",
        patches=(
            Patch(
                "gat/main.py",
                "attention = F.dropout(attention, self.dropout, training=self.training)",
                "attention = F.dropout(attention, self.dropout)",
            ),
        ),
    ),
)

# The programs' own bugs, as they are in their repositories: each runs with its ports only
# (programs.py `port`, not `fixes`), under torchdoctor, and what a truthful doctor says is
# declared as for a planted bug. The healthy runs apply the fixes (programs.py `fixes`).
REAL_BUGS: tuple[Bug, ...] = (
    Bug(
        name="tsp_load_weights_only",
        program="time_sequence_prediction",
        what="torch.load('traindata.pt') of the NumPy array the program's own generator "
        "saved: since torch 2.6 torch.load defaults to weights_only=True, which refuses "
        "NumPy's pickled objects, and the program fails before its first step",
        kinds=("crash",),
        lines=(Line("time_sequence_prediction/train.py", "data = torch.load('traindata.pt')"),),
        fix=r"weights_only=False",
    ),
    Bug(
        name="tp_no_zero_grad",
        program="tensor_parallel",
        what="the training loop never calls optimizer.zero_grad(): every AdamW step applies "
        "the sum of all gradients so far",
        kinds=("grad_not_cleared",),
        lines=(
            Line(TP, "optimizer.step()"),
            Line(TP, "output.sum().backward()"),
        ),
        fix=r"zero_grad",
    ),
    Bug(
        name="sp_no_zero_grad",
        program="sequence_parallel",
        what="the sequence-parallel loop never calls optimizer.zero_grad() either: every AdamW "
        "step applies the sum of all gradients so far",
        kinds=("grad_not_cleared",),
        lines=(
            Line(SP, "optimizer.step()"),
            Line(SP, "output.sum().backward()"),
        ),
        fix=r"zero_grad",
    ),
    Bug(
        name="ddp_tutorial_one_class",
        program="ddp_tutorial",
        what="F.cross_entropy(output, targets) on the one output of a Linear(20, 1) against "
        "random values in [0, 1): log_softmax over one class is 0, so the loss is 0 on every "
        "step and no weight ever changes (the DDP tutorial's multigpu_torchrun.py)",
        kinds=("loss_inputs",),
        lines=(
            Line(DDP_TUTORIAL, "loss.backward()"),
            Line(DDP_TUTORIAL, "loss = F.cross_entropy(output, targets)"),
        ),
        fix=r"mse_loss",
    ),
    Bug(
        name="fsdp2_layers_never_initialised",
        program="fsdp2",
        what="after model.to_empty(), Transformer.reset_parameters() initialises the root's "
        "own modules only (embeddings, norm, output): the layers keep to_empty()'s "
        "uninitialised memory (NaN from the first step here)",
        kinds=("nan",),
        modules=("layers.*",),  # any module of the layers
        lines=(Line(FSDP2, "model.to_empty(device=device)"),),
        # The fix is at to_empty(): initialise the layers too. (A fix that says "load the
        # checkpoint again" or "lower the learning rate" is not it: there is no checkpoint,
        # and no update has run.)
        fix=r"to_empty|reset_parameters",
    ),
)
