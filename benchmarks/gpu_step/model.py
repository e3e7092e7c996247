"""The step benchmark's network: ResNet-50's layout in plain torch.nn, and its training
step (forward, backward, SGD)."""
from __future__ import annotations


def resnet50_like(width: int = 64, blocks=(3, 4, 6, 3), classes: int = 1000):
    """ResNet-50's layout in plain torch.nn (no torchvision): 7x7 stem, bottleneck stages."""
    import torch.nn as nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, mid, stride):
            super().__init__()
            cout = 4 * mid
            self.body = nn.Sequential(
                nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(inplace=True),
                nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid),
                nn.ReLU(inplace=True), nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
            self.skip = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.relu(self.body(x) + self.skip(x))

    layers = [nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
              nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    cin = width
    for stage, count in enumerate(blocks):
        for j in range(count):
            layers.append(Bottleneck(cin, width * 2**stage, 2 if j == 0 and stage else 1))
            cin = 4 * width * 2**stage
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def make_step(model, device):
    """``step(images, labels) -> loss``: forward, backward and SGD (bfloat16 autocast on CUDA)."""
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    amp = device.type == "cuda"

    def step(images, labels):
        x = images.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = loss_fn(model(x if amp else x.float()), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    return step
