"""Model builders: each takes a ``DatasetSpec`` so any model runs on any dataset."""

from __future__ import annotations

from torch import nn

from suite.api import DatasetSpec


def cifar_stem(model: nn.Module, in_chans: int) -> nn.Module:
    """Swap an ImageNet ResNet stem for a 3x3 stride-1 conv without max-pool.

    The ImageNet stem (7x7 stride-2 conv, then max-pool) shrinks a 32x32 image to 8x8
    before the first block, which costs CIFAR accuracy; this is the usual CIFAR variant.
    """
    out_channels = model.conv1.out_channels
    model.conv1 = nn.Conv2d(in_chans, out_channels, 3, stride=1, padding=1, bias=False)
    # the same init timm gives every other conv, so the new layer is not the odd one out
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    model.maxpool = nn.Identity()
    return model


def _timm_resnet(name: str, spec: DatasetSpec) -> nn.Module:
    import timm  # here, not with the module: it costs a process ~4 s that most runs never use

    model = timm.create_model(
        name, pretrained=False, num_classes=spec.num_classes, in_chans=spec.in_chans
    )
    return cifar_stem(model, spec.in_chans)


def resnet18(spec: DatasetSpec) -> nn.Module:
    return _timm_resnet("resnet18", spec)


def resnet152(spec: DatasetSpec) -> nn.Module:
    return _timm_resnet("resnet152", spec)


def wide_resnet50_2(spec: DatasetSpec) -> nn.Module:
    return _timm_resnet("wide_resnet50_2", spec)


def _conv_bn_relu(in_chans: int, out_chans: int) -> list[nn.Module]:
    return [
        nn.Conv2d(in_chans, out_chans, 3, padding=1, bias=False),  # BN supplies the bias
        nn.BatchNorm2d(out_chans),
        nn.ReLU(inplace=True),
    ]


class SmallCNN(nn.Module):
    """Four conv-BN-ReLU layers and a linear head (~242k parameters for 1x28x28 input).

    Pooling after the first two convs keeps it cheap enough for CPU smoke runs; global
    average pooling makes it indifferent to the input size, so ``--dataset`` can swap data.
    """

    def __init__(self, in_chans: int = 1, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            *_conv_bn_relu(in_chans, 32),
            nn.MaxPool2d(2),
            *_conv_bn_relu(32, 64),
            nn.MaxPool2d(2),
            *_conv_bn_relu(64, 128),
            *_conv_bn_relu(128, 128),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.fc = nn.Linear(128, num_classes)

    def forward(self, x):
        return self.fc(self.features(x))


def small_cnn(spec: DatasetSpec) -> nn.Module:
    return SmallCNN(spec.in_chans, spec.num_classes)


#: the small ViT's shape: 4x4 patches (49 tokens on 28x28, 64 on 32x32), 6 blocks of width
#: 128 with 4 heads of 32 and MLPs of 512 hidden neurons (~1.2M parameters)
VIT_SHAPE = {"patch_size": 4, "embed_dim": 128, "depth": 6, "num_heads": 4, "mlp_ratio": 4.0}


def vit_small_images(spec: DatasetSpec) -> nn.Module:
    """timm's VisionTransformer sized for 28x28 and 32x32 images (VIT_SHAPE): the attention
    heads and MLP neurons PruneX prunes with --head-keep and --mlp-keep."""
    # lazy: timm.models.vision_transformer costs ~1.7 s to import; only this path needs it
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(img_size=spec.image_size, in_chans=spec.in_chans,
                             num_classes=spec.num_classes, **VIT_SHAPE)


def mobilenetv3_small(spec: DatasetSpec) -> nn.Module:
    """timm's MobileNetV3-Small at width 0.5 (~0.58M parameters): depthwise convs,
    squeeze-excitation with conv biases, hardswish, 34 BatchNorm layers in series."""
    # lazy: timm costs ~1.6 s to import; only this path needs it
    import timm

    return timm.create_model("mobilenetv3_small_050", pretrained=False,
                             num_classes=spec.num_classes, in_chans=spec.in_chans)


#: CNN families held out from PruneX's tuning (benchmarks/families.py): timm models as a user
#: would create them for 1x28x28 images, native stems (ImageNet strides: the features pool
#: to 1x1, cheap on CPU ranks), small widths
FAMILIES = {
    "resnet10t": {},  # ResNet-D-style deep stem, basic blocks
    "regnetx_002": {},  # RegNetX-200MF: grouped 3x3 convs
    "efficientnet_b0": {},  # MBConv: depthwise convs, squeeze-excitation, SiLU
    "ghostnet_050": {},  # Ghost modules: cheap depthwise features concatenated
}


def timm_family(name: str):
    """A builder of timm's ``name`` with no pretrained weights (FAMILIES)."""

    def build(spec: DatasetSpec) -> nn.Module:
        import timm  # lazy: ~1.6 s to import; only this path needs it

        return timm.create_model(name, pretrained=False, num_classes=spec.num_classes,
                                 in_chans=spec.in_chans, **FAMILIES[name])

    build.__name__ = name
    return build


def convnext_small_images(spec: DatasetSpec) -> nn.Module:
    """timm's ConvNeXt (depthwise 7x7, LayerNorm, inverted MLP with layer scale) at widths
    16-128 with a 2x2 patch stem and output stride 16 (the last stage dilated), so 28x28
    images keep 2x2 maps (ImageNet's layout pools them away before its 7x7 kernels)."""
    from timm.models.convnext import ConvNeXt  # lazy: as above

    return ConvNeXt(in_chans=spec.in_chans, num_classes=spec.num_classes, depths=(1, 1, 2, 1),
                    dims=(16, 32, 64, 128), patch_size=2, output_stride=16)


def convmixer_64_4(spec: DatasetSpec) -> nn.Module:
    """timm's ConvMixer-64/4 (2x2 patches, 5x5 depthwise kernels): residual depthwise blocks
    (depthwise conv, GELU, BN, + input), each followed by a pointwise conv, GELU, BN."""
    from timm.models.convmixer import ConvMixer  # lazy: as above

    return ConvMixer(64, 4, kernel_size=5, patch_size=2, in_chans=spec.in_chans,
                     num_classes=spec.num_classes)


def timm_by_name(name: str):
    """A builder of any timm model ``name``, randomly initialized, for the dataset's image
    channels, size (where the model takes one: ViTs, Swin) and classes."""

    def build(spec: DatasetSpec) -> nn.Module:
        import timm  # lazy: ~1.6 s to import; only this path needs it

        kwargs = {"pretrained": False, "num_classes": spec.num_classes,
                  "in_chans": spec.in_chans}
        try:
            return timm.create_model(name, img_size=spec.image_size, **kwargs)
        except TypeError:  # a model without an image size of its own: any size goes
            return timm.create_model(name, **kwargs)

    build.__name__ = name
    return build


def timm_sizes(name: str) -> tuple[int | None, int | None]:
    """(the image side timm's model ``name`` is made for, the smallest its pretrained config
    states it takes): its ``pretrained_cfg``'s ``input_size`` and ``min_input_size``, read
    from the registry without building the model (None where it states none)."""
    import timm  # lazy: ~1.6 s to import; only this path needs it

    cfg = timm.get_pretrained_cfg(name)
    native = cfg.input_size[-1] if cfg is not None and cfg.input_size else None
    smallest = cfg.min_input_size[-1] if cfg is not None and cfg.min_input_size else None
    return native, smallest


def torchvision_sizes(name: str) -> tuple[int | None, int | None]:
    """(the image side torchvision's classifier ``name`` is made for, the smallest its
    weights' metadata states it takes): the first weights' crop size and ``min_size`` (None
    where they state none)."""
    import torchvision  # lazy: only this path needs it

    weights = list(torchvision.models.get_model_weights(name))
    if not weights:
        return None, None
    first = weights[0]
    crop = getattr(first.transforms, "keywords", {}).get("crop_size")
    native = crop[-1] if isinstance(crop, (list, tuple)) else crop
    smallest = first.meta.get("min_size")
    return native, smallest[-1] if smallest else None


#: torchvision classifiers whose auxiliary heads return a tuple in training: left out
AUXILIARY_HEADS = ("googlenet", "inception_v3")


def torchvision_by_name(name: str):
    """A builder of torchvision's classifier ``name`` with no weights, for the dataset's
    classes (and image size, where the model takes one); for images of other than 3
    channels the first conv reads the dataset's channels instead (newly initialized, the
    rest of the model as it is)."""

    def build(spec: DatasetSpec) -> nn.Module:
        import torchvision  # lazy: only this path needs it

        kwargs = {"weights": None, "num_classes": spec.num_classes}
        if name in AUXILIARY_HEADS:
            kwargs.update(aux_logits=False, init_weights=True)
        if name.startswith("vit_"):
            kwargs["image_size"] = spec.image_size
        model = torchvision.models.get_model(name, **kwargs)
        return with_input_channels(model, spec.in_chans) if spec.in_chans != 3 else model

    build.__name__ = name
    return build


def with_input_channels(model: nn.Module, in_chans: int) -> nn.Module:
    """``model`` whose first conv reading 3 channels reads ``in_chans`` instead (a new conv of
    the same kind, initialized as the rest; torchvision's classifiers take RGB only)."""
    for parent in model.modules():
        for child_name, child in parent.named_children():
            if isinstance(child, nn.Conv2d) and child.in_channels == 3:
                conv = nn.Conv2d(in_chans, child.out_channels, child.kernel_size, child.stride,
                                 child.padding, child.dilation, groups=1,
                                 bias=child.bias is not None, padding_mode=child.padding_mode)
                nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
                setattr(parent, child_name, conv)
                return model
    return model
