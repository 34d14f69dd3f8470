"""An arrival's tenant, for ``calls_probe.sh``: ``MODE=rule`` calls ``Tenancy.rule``
(``vtc._core.TenantRule``, what the vLLM queue calls) on vLLM-shaped requests of 64
known tenants; ``MODE=fields`` names them as the vLLM shell did before optimisation 41:
a shell method calling ``Tenancy.arrive`` of the two fields ``vtc.vllm.tenant_fields``
reads (written out here: ``vtc.vllm`` needs vLLM); ``MODE=none`` the bare loop."""

import os
from types import SimpleNamespace
from typing import Any

import vtc
from vtc.adapter import Tenancy
from vtc.config import EngineConfig

CALLS = int(os.environ.get("CALLS", "0"))
MODE = os.environ.get("MODE", "rule")

tenancy = Tenancy(vtc.Scheduler(1000), EngineConfig(), forget_every=10**9)
requests = [
    SimpleNamespace(
        sampling_params=SimpleNamespace(extra_args={"tenant": f"t{i}"}), lora_request=None
    )
    for i in range(64)
]
for r in requests:
    tenancy.arrive([r.sampling_params.extra_args["tenant"]])  # known tenants


def tenant_fields(request: Any, key: str = "tenant") -> tuple[Any, Any]:
    params = request.sampling_params
    extra = getattr(params, "extra_args", None) if params is not None else None
    lora = request.lora_request
    return (
        extra.get(key) if isinstance(extra, dict) else None,
        getattr(lora, "lora_name", None) if lora is not None else None,
    )


class Shell:
    key = "tenant"

    def tenant(self, request: Any) -> str:
        return tenancy.arrive(tenant_fields(request, self.key))


def run() -> None:
    name = {"rule": tenancy.rule, "fields": Shell().tenant}.get(MODE)
    if name is None:
        for i in range(CALLS):
            requests[i & 63]
    else:
        for i in range(CALLS):
            name(requests[i & 63])


run()
