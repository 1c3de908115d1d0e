"""The GPU runtime: the CUDA driver binding (cuda), the launch ABI (params), cubin
loading and launching (loader), ``flash_attention`` (attention), the correctness
rule (check) and event timing (timing). Import the submodule you need; nothing
here touches CUDA at import time."""
