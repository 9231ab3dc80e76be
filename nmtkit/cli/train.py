"""`nmtkit train DATA_DIR --arch NAME --save-dir DIR`: flags only; the work is nmtkit.training.trainer."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Optional

import typer

from nmtkit.cli.app import app
from nmtkit.cli.arch_options import with_arch_options

P_DATA = "Data and batching"
P_OPT = "Optimization"
P_DEV = "Device and precision"
P_STOP = "Stopping"
P_VALID = "Validation"
P_CKPT = "Checkpoints"
P_LOG = "Logging and robustness"


@app.command("train")
@with_arch_options(exclude=("warmup_steps",))  # --warmup-updates below sets it
def train_cmd(
    data_dir: Path = typer.Argument(..., help="A data directory written by 'nmtkit preprocess'."),
    arch: str = typer.Option("transformer_base", "--arch", help="Named architecture (see 'nmtkit archs'); the flags in the Architecture panel override its fields."),
    save_dir: Path = typer.Option(..., "--save-dir", help="Checkpoints and train_log.jsonl go here; if it holds checkpoint_last.pt, training resumes from it."),
    # data and batching
    max_tokens: Optional[int] = typer.Option(4096, "--max-tokens", help="Token budget per batch and process: sentences x longest side (+1), padding included.", rich_help_panel=P_DATA),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="At most this many sentence pairs per batch.", rich_help_panel=P_DATA, show_default=False),
    update_freq: int = typer.Option(1, "--update-freq", help="Accumulate gradients over K batches per update (per process).", rich_help_panel=P_DATA),
    train_subset: str = typer.Option("train", "--train-subset", help="Split of DATA_DIR to train on.", rich_help_panel=P_DATA),
    valid_subset: str = typer.Option("valid", "--valid-subset", help="Split of DATA_DIR to validate on.", rich_help_panel=P_DATA),
    # optimization
    lr_scheduler: str = typer.Option("noam", "--lr-scheduler", help="noam (the paper: lr-scale * d_model^-0.5 * min(u^-0.5, u * warmup^-1.5)) or inverse_sqrt (fairseq: linear warmup to --lr, then --lr * sqrt(warmup/u)).", rich_help_panel=P_OPT),
    lr_scale: float = typer.Option(1.0, "--lr-scale", help="noam: multiplies the paper's learning rate.", rich_help_panel=P_OPT),
    lr: float = typer.Option(5e-4, "--lr", help="inverse_sqrt: the peak learning rate, reached after warmup.", rich_help_panel=P_OPT),
    warmup_updates: Optional[int] = typer.Option(None, "--warmup-updates", help="Warmup updates of either schedule; sets the architecture's warmup_steps field [default: the architecture's, 4000 for the paper's models].", rich_help_panel=P_OPT, show_default=False),
    warmup_init_lr: float = typer.Option(0.0, "--warmup-init-lr", help="inverse_sqrt: learning rate at update 0 of the warmup.", rich_help_panel=P_OPT),
    adam_betas: str = typer.Option("0.9,0.98", "--adam-betas", help="Adam beta1,beta2.", rich_help_panel=P_OPT),
    adam_eps: float = typer.Option(1e-9, "--adam-eps", help="Adam epsilon.", rich_help_panel=P_OPT),
    weight_decay: float = typer.Option(0.0, "--weight-decay", help="Decoupled weight decay (AdamW); 0 = plain Adam as in the paper.", rich_help_panel=P_OPT),
    clip_norm: float = typer.Option(0.0, "--clip-norm", help="Clip the gradient's global L2 norm to this; 0 = no clipping (the paper).", rich_help_panel=P_OPT),
    # device and precision
    precision: str = typer.Option("fp32", "--precision", help="fp32, bf16 (autocast) or fp16 (autocast + dynamic loss scaling).", rich_help_panel=P_DEV),
    compile_: bool = typer.Option(False, "--compile", help="torch.compile the model (slow first steps, faster afterwards).", rich_help_panel=P_DEV),
    device: str = typer.Option("auto", "--device", help="auto (CUDA if available), cpu, cuda (this process's LOCAL_RANK under torchrun), cuda:N or mps.", rich_help_panel=P_DEV),
    threads: Optional[int] = typer.Option(None, "--threads", help="CPU threads for torch [default: torch's choice].", rich_help_panel=P_DEV, show_default=False),
    seed: int = typer.Option(1, "--seed", help="Seed for initialization, dropout and batch shuffling.", rich_help_panel=P_DEV),
    # stopping
    max_update: int = typer.Option(0, "--max-update", help="Stop after this many updates; 0 = no limit.", rich_help_panel=P_STOP),
    max_epoch: int = typer.Option(0, "--max-epoch", help="Stop after this many epochs; 0 = no limit.", rich_help_panel=P_STOP),
    max_time: Optional[str] = typer.Option(None, "--max-time", help="Stop after this much training time over all runs: 3600, 90m, 12h, 2d or 1:30:00.", rich_help_panel=P_STOP, show_default=False),
    # validation
    validate_interval_updates: int = typer.Option(0, "--validate-interval-updates", help="Also validate every N updates (always at each epoch end); 0 = epoch ends only.", rich_help_panel=P_VALID),
    no_validate: bool = typer.Option(False, "--no-validate", help="Never validate.", rich_help_panel=P_VALID),
    patience: int = typer.Option(0, "--patience", help="Stop after N validations in a row without improvement of --best-checkpoint-metric; 0 = never.", rich_help_panel=P_VALID),
    eval_bleu: bool = typer.Option(False, "--eval-bleu", help="Also decode the valid split and compute sacreBLEU at each validation.", rich_help_panel=P_VALID),
    eval_bleu_beam: int = typer.Option(1, "--eval-bleu-beam", help="Beam size for --eval-bleu (1 = greedy).", rich_help_panel=P_VALID),
    eval_bleu_lenpen: float = typer.Option(0.6, "--eval-bleu-lenpen", help="Length penalty alpha (GNMT form) for --eval-bleu with a beam.", rich_help_panel=P_VALID),
    eval_bleu_max_len_a: float = typer.Option(1.2, "--eval-bleu-max-len-a", help="--eval-bleu output limit: a * source length + b.", rich_help_panel=P_VALID),
    eval_bleu_max_len_b: int = typer.Option(10, "--eval-bleu-max-len-b", help="--eval-bleu output limit: a * source length + b.", rich_help_panel=P_VALID),
    best_checkpoint_metric: str = typer.Option("loss", "--best-checkpoint-metric", help="loss (validation nll, lower is better) or bleu (needs --eval-bleu) chooses checkpoint_best.pt and drives --patience.", rich_help_panel=P_VALID),
    ema_decay: float = typer.Option(0.0, "--ema-decay", help="Keep an exponential moving average of the weights with this decay (e.g. 0.9999); validation then uses it. 0 = off.", rich_help_panel=P_VALID),
    # checkpoints
    save_interval_updates: int = typer.Option(0, "--save-interval-updates", help="Write checkpoint_EPOCH_UPDATE.pt every N updates; 0 = off.", rich_help_panel=P_CKPT),
    save_interval_minutes: float = typer.Option(0.0, "--save-interval-minutes", help="Write checkpoint_EPOCH_UPDATE.pt every M minutes (the paper: 10); 0 = off.", rich_help_panel=P_CKPT),
    keep_last_updates: int = typer.Option(0, "--keep-last-updates", help="Keep only the newest N checkpoint_EPOCH_UPDATE.pt; 0 = keep all.", rich_help_panel=P_CKPT),
    keep_last_epochs: int = typer.Option(0, "--keep-last-epochs", help="Keep only the newest N checkpointEPOCH.pt; 0 = keep all.", rich_help_panel=P_CKPT),
    no_epoch_checkpoints: bool = typer.Option(False, "--no-epoch-checkpoints", help="Do not write checkpointEPOCH.pt (checkpoint_last.pt is still updated).", rich_help_panel=P_CKPT),
    # logging and robustness
    log_interval: int = typer.Option(100, "--log-interval", help="Log training statistics every N updates.", rich_help_panel=P_LOG),
    no_progress_bar: bool = typer.Option(False, "--no-progress-bar", help="Plain log lines instead of the progress bar.", rich_help_panel=P_LOG),
    max_nan_skips: int = typer.Option(10, "--max-nan-skips", help="Stop after this many NaN/inf updates in a row (each is skipped).", rich_help_panel=P_LOG),
    arch_overrides: Optional[dict] = None,
) -> None:
    """Train a Transformer on a preprocessed data directory (resumes from SAVE_DIR/checkpoint_last.pt)."""
    from nmtkit.training.config import TrainConfig, parse_betas, parse_duration
    from nmtkit.training.trainer import train

    overrides = {k: v for k, v in (arch_overrides or {}).items() if v is not None}
    if warmup_updates is not None:  # the architecture's warmup_steps field, under fairseq's flag name
        overrides["warmup_steps"] = warmup_updates
    cfg = TrainConfig(
        data_dir=str(data_dir), save_dir=str(save_dir), arch=arch, arch_overrides=overrides,
        max_tokens=max_tokens if max_tokens else None, batch_size=batch_size, update_freq=update_freq,
        train_subset=train_subset, valid_subset=valid_subset,
        lr_scheduler=lr_scheduler, lr_scale=lr_scale, lr=lr, warmup_updates=warmup_updates,
        warmup_init_lr=warmup_init_lr, adam_betas=parse_betas(adam_betas), adam_eps=adam_eps,
        weight_decay=weight_decay, clip_norm=clip_norm,
        precision=precision, compile=compile_, device=device, threads=threads, seed=seed,
        max_update=max_update, max_epoch=max_epoch, max_time=parse_duration(max_time) if max_time else 0.0,
        validate_interval_updates=validate_interval_updates, no_validate=no_validate, patience=patience,
        eval_bleu=eval_bleu, eval_bleu_beam=eval_bleu_beam, eval_bleu_lenpen=eval_bleu_lenpen,
        eval_bleu_max_len_a=eval_bleu_max_len_a, eval_bleu_max_len_b=eval_bleu_max_len_b,
        best_checkpoint_metric=best_checkpoint_metric, ema_decay=ema_decay,
        save_interval_updates=save_interval_updates, save_interval_minutes=save_interval_minutes,
        keep_last_updates=keep_last_updates, keep_last_epochs=keep_last_epochs,
        no_epoch_checkpoints=no_epoch_checkpoints, log_interval=log_interval,
        progress_bar=not no_progress_bar, max_nan_skips=max_nan_skips,
    )
    result = train(cfg)
    best = f"; best {cfg.best_checkpoint_metric} {result.best:.4f}" if result.best is not None else ""
    messages = {
        "max_update": "reached --max-update", "max_epoch": "reached --max-epoch", "max_time": "reached --max-time",
        "patience": f"no improvement in {cfg.patience} validations (--patience)",
        "signal": "interrupted; run the same command to resume",
        "already_done": "nothing to do: the checkpoint already reached the stopping rule",
    }
    print(f"{messages.get(result.reason, result.reason)}: update {result.update}, epoch {result.epoch}{best}; "
          f"checkpoints in {save_dir}")
    if result.reason == "signal":
        # 128 + signal number, as a shell reports a process stopped by it; checkpoint_last.pt is saved.
        raise typer.Exit(128 + int(signal.SIGTERM if result.interrupted_by == signal.SIGTERM else signal.SIGINT))
