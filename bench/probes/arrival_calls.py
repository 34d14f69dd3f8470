"""An arrival's tenant, for ``calls_probe.sh``: ``MODE=rule`` calls ``Tenancy.rule``
(``vtc._core.TenantRule``, what the vLLM queue calls) on vLLM-shaped requests of 64
known tenants; ``MODE=fields`` names them as the vLLM shell did before optimisation 41:
a shell method calling ``Tenancy.arrive`` of the two fields ``vtc.vllm.tenant_fields``
reads (``vtc.adapter.vllm_tenant_fields``); ``MODE=none`` the bare loop."""

import os
from types import SimpleNamespace
from typing import Any

import vtc
from vtc.adapter import Tenancy, vllm_tenant_fields
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


class Shell:
    key = "tenant"

    def tenant(self, request: Any) -> str:
        return tenancy.arrive(vllm_tenant_fields(request, self.key))


def run() -> None:
    name = {"rule": tenancy.rule, "fields": Shell().tenant}.get(MODE)
    if name is None:
        for i in range(CALLS):
            requests[i & 63]
    else:
        for i in range(CALLS):
            name(requests[i & 63])


run()
