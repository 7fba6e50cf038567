"""The Lightning and Hugging Face callbacks drive the tracker through real training loops (CPU, one process)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from gpuidle.api import analyze
from gpuidle.model import TRACKER_SUMMARY

DELAY_S = 0.004


class SlowItems(Dataset[dict[str, torch.Tensor]]):
    """Samples that take ``DELAY_S`` each to load."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        time.sleep(DELAY_S)
        g = torch.Generator().manual_seed(i)
        return {"x": torch.randn(8, generator=g), "labels": torch.randint(0, 2, (), generator=g)}


def _steps(out: Path) -> list[dict[str, object]]:
    lines = [json.loads(x) for x in (out / "rank-0.jsonl").read_text().splitlines()]
    return [x for x in lines if x["type"] == "step"]


def test_lightning_callback(tmp_path: Path) -> None:
    pl = pytest.importorskip("lightning.pytorch")
    from gpuidle.torch import GpuidleLightningCallback

    class Module(pl.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(8, 2)

        def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
            return nn.functional.cross_entropy(self.net(batch["x"]), batch["labels"])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    callback = GpuidleLightningCallback(str(tmp_path), log=lambda _: None)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=6, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])
    trainer.fit(Module(), DataLoader(SlowItems(), batch_size=4))
    steps = _steps(tmp_path)
    assert len(steps) == 6
    for s in steps:
        phases = s["phases"]
        assert isinstance(phases, dict)
        assert phases["forward"] > 0
        assert phases["backward"] > 0
        assert phases["optimizer"] > 0
        assert s["samples"] == 4
    assert all(int(s["data_ns"]) >= 4 * DELAY_S * 1e9 for s in steps[1:])  # type: ignore[call-overload]
    assert (tmp_path / TRACKER_SUMMARY).exists()
    report = analyze([tmp_path])
    assert report.recommendations[0].id == "dataloader_workers"


def test_transformers_trainer_callback(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from gpuidle.torch import GpuidleTrainerCallback

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(8, 2)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": nn.functional.cross_entropy(self.net(x), labels)}

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), max_steps=5, per_device_train_batch_size=4, gradient_accumulation_steps=2,
        report_to=[], use_cpu=True, logging_steps=2, save_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0,
    )
    callback = GpuidleTrainerCallback(str(tmp_path / "run"), log=lambda _: None)
    trainer = transformers.Trainer(model=Model(), args=args, train_dataset=SlowItems(), callbacks=[callback])
    trainer.train()
    steps = _steps(tmp_path / "run")
    assert len(steps) == 5
    for s in steps:
        phases = s["phases"]
        assert isinstance(phases, dict)
        assert phases["forward_backward"] > 0
        assert phases["optimizer"] > 0
        assert s["samples"] == 8
        assert s["batches"] == 2
        assert int(s["data_ns"]) >= 8 * DELAY_S * 1e9  # type: ignore[call-overload]
    report = analyze([tmp_path / "run"])
    assert report.recommendations[0].id == "dataloader_workers"
