"""VGG-5 and VGG-8 exactly as FedComm defines them (3x3 convs with padding 1, BatchNorm, ReLU)."""

from __future__ import annotations

import torch
from torch import nn

# Each entry is a conv's output channels, or "M" for a 2x2 max-pool.
VGG_LAYOUTS: dict[str, list[int | str]] = {
    "vgg5": [32, "M", 64, "M", 64],
    "vgg8": [32, 32, "M", 64, 64, "M", 128, 128],
}


class VGG(nn.Module):
    """A small VGG for 3x32x32 images: conv blocks, then fc -> 128 -> ``num_classes``."""

    def __init__(self, layout: list[int | str], num_classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels, side = 3, 32
        for item in layout:
            if item == "M":
                layers.append(nn.MaxPool2d(2))
                side //= 2
            else:
                layers += [
                    nn.Conv2d(channels, int(item), 3, padding=1),
                    nn.BatchNorm2d(int(item)),
                    nn.ReLU(inplace=True),
                ]
                channels = int(item)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(channels * side * side, 128),
            nn.ReLU(inplace=True),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def build_model(name: str, num_classes: int = 10) -> VGG:
    """``"vgg5"`` (582,346 parameters) or ``"vgg8"`` (1,337,898 parameters)."""
    try:
        layout = VGG_LAYOUTS[name.lower()]
    except KeyError:
        raise ValueError(
            f"unknown model {name!r}; choose one of {', '.join(VGG_LAYOUTS)}"
        ) from None
    return VGG(layout, num_classes)


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters (BatchNorm running statistics are buffers, not counted)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
