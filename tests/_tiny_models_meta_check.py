"""Helper for test_tiny_models.py, run in a subprocess (it imports ComfyUI, which sets global
state): argv = comfyui dir, tests dir, JSON {name: config}. For each config, builds our state
dict's shapes on the meta device, lets ComfyUI's model detection read them, builds ComfyUI's
own model class on the meta device and compares parameter names and shapes. Prints JSON."""
import json
import sys

sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[2])
import torch  # noqa: E402

import tiny_models as tm  # noqa: E402
from comfy.cli_args import args  # noqa: E402

if not torch.cuda.is_available():
    args.cpu = True
import comfy.model_detection as md  # noqa: E402

res = {}
for name, cfg in json.loads(sys.argv[3]).items():
    sd = {n: torch.empty(s, dtype=torch.bfloat16, device="meta") for n, s, _ in tm.specs_for(cfg)}
    unet_config = md.detect_unet_config(sd, "")
    mc = md.model_config_from_unet(sd, "")
    sd2 = mc.process_unet_state_dict(dict(sd))
    with torch.device("meta"):
        model = mc.get_model(sd2, "", device="meta")
    want = {k: tuple(v.shape) for k, v in model.diffusion_model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in sd2.items()}
    res[name] = {"class": type(mc).__name__,
                 "detected": {k: v for k, v in unet_config.items() if isinstance(v, (int, float, str, list, type(None)))},
                 "missing": sorted(set(want) - set(got)), "unexpected": sorted(set(got) - set(want)),
                 "shape_mismatch": sorted(k for k in set(want) & set(got) if want[k] != got[k])}
print(json.dumps(res))
