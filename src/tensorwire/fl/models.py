"""The built-in models: VGG-5 and VGG-8 exactly as FedComm defines them (3x3 convs with
padding 1, BatchNorm, ReLU), ResNet-18 in its CIFAR variant (3x3 stem, no max-pool; 11.2 M
parameters, 45 MB), ``mlp`` (a small one, for runs of a thousand devices), and
``payload:<size>``: synthetic updates of that size for measuring communication without
training."""

from __future__ import annotations

import functools

import torch
from torch import nn

from tensorwire.fl.config import BUILTIN_MODELS, payload_bytes

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


class BasicBlock(nn.Module):
    """ResNet's two 3x3 convs with BatchNorm and a shortcut (a 1x1 conv where the shape
    changes)."""

    def __init__(self, channels: int, out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out)
        self.conv2 = nn.Conv2d(out, out, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or channels != out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(channels, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 for 3x32x32 images (the CIFAR variant: a 3x3 stem conv, no max-pool), four
    stages of two :class:`BasicBlock` each, 64 to 512 channels: 11,173,962 parameters."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True)
        )
        blocks: list[nn.Module] = []
        channels = 64
        for out, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [BasicBlock(channels, out, stride), BasicBlock(out, out, 1)]
            channels = out
        self.layers = nn.Sequential(*blocks)
        self.head = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


MLP_HIDDEN = 16  # the hidden units of ``mlp``: 49,338 parameters, 197 KB


class MLP(nn.Module):
    """The smallest built-in model: 3x32x32 flattened, one hidden layer of
    :data:`MLP_HIDDEN` ReLU units, ``num_classes`` outputs; for runs of many devices, where
    every device process holds a model per device."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Flatten(),
            nn.Linear(3 * 32 * 32, MLP_HIDDEN),
            nn.ReLU(inplace=True),
            nn.Linear(MLP_HIDDEN, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


PAYLOAD_TENSOR = 1 << 21  # the most elements one payload tensor holds (8 MB of float32)


class Payload(nn.Module):
    """A model whose state is ``nbytes`` of float32 (rounded down to whole values) and that
    learns nothing: its ``payload.<i>`` tensors, at most 8 MB each as a real model's layers
    are, take no part in the forward pass, so training leaves them as they came and only the
    ``num_classes`` biases of its constant output move. A run on it measures communication
    alone: the devices' updates are the payload's size, the training steps take microseconds.
    The payload starts as fixed pseudo-random values (seed 0), so compression finds no easy
    pattern in the global model."""

    def __init__(self, nbytes: int, num_classes: int = 10) -> None:
        super().__init__()
        values = max(nbytes // 4 - num_classes, 1)
        gen = torch.Generator().manual_seed(0)
        sizes = [PAYLOAD_TENSOR] * (values // PAYLOAD_TENSOR)
        sizes += [values % PAYLOAD_TENSOR] if values % PAYLOAD_TENSOR else []
        self.payload = nn.ParameterList(
            nn.Parameter(torch.randn(n, generator=gen), requires_grad=False) for n in sizes
        )
        self.bias = nn.Parameter(torch.zeros(num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bias.expand(len(x), -1)


def build_model(name: str, num_classes: int = 10) -> nn.Module:
    """``"vgg5"`` (582,346 parameters), ``"vgg8"`` (1,337,898), ``"resnet18"`` (11,173,962),
    ``"mlp"`` (49,338), or ``"payload:<size>"`` (``payload:10MB``: a :class:`Payload` of
    10,000,000 bytes)."""
    size = payload_bytes(name)
    if size is not None:
        return Payload(size, num_classes)
    if name.lower() == "resnet18":
        return ResNet18(num_classes)
    if name.lower() == "mlp":
        return MLP(num_classes)
    try:
        layout = VGG_LAYOUTS[name.lower()]
    except KeyError:
        raise ValueError(
            f"unknown model {name!r}; choose one of {', '.join(BUILTIN_MODELS)} or "
            "payload:<size> (e.g. payload:10MB)"
        ) from None
    return VGG(layout, num_classes)


@functools.cache  # a benchmark asks per experiment, several times; building ResNet-18 is slow
def model_bytes(name: str) -> int | None:
    """The bytes of a built-in model's state (parameters and buffers), without building it
    for a payload; None for a name that is not built in."""
    size = payload_bytes(name)
    if size is not None:
        return size
    try:
        model = build_model(name)
    except ValueError:
        return None
    return sum(v.numel() * v.element_size() for v in model.state_dict().values())


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters (BatchNorm running statistics are buffers, not counted)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
