"""bert_jax.cpu_backend: on the CPU, a jitted function's temporaries stop faulting pages in once bert_jax is imported
before JAX starts (a fresh process each, since the setting must come before JAX's threads exist)."""
import subprocess
import sys

from bert_jax import cpu_backend

# A 64 MB temporary per call (the outer product both matmuls read); prints the fifth call's minor page faults.
FAULTS_OF_A_CALL = """
import resource, sys
if sys.argv[1] == "bert_jax":
    import bert_jax  # noqa: F401
import jax, jax.numpy as jnp
f = jax.jit(lambda x: jnp.outer(jnp.sin(x), x) @ x + jnp.outer(jnp.cos(x), x).T @ x)
x = jnp.ones(4000)
for _ in range(4):
    f(x).block_until_ready()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
f(x).block_until_ready()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(first_import: str) -> int:
    out = subprocess.run([sys.executable, "-c", FAULTS_OF_A_CALL, first_import], check=True, capture_output=True,
                         text=True, env={"JAX_PLATFORMS": "cpu", "PATH": ""})
    return int(out.stdout.split()[-1])


def test_temporaries_stay_mapped_on_the_cpu():
    temporary_pages = 4000 * 4000 * 4 // 4096
    assert faults("jax") > temporary_pages // 2  # JAX alone maps the temporary anew each call
    assert faults("bert_jax") < temporary_pages // 20


def test_only_a_cpu_run_is_tuned(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert cpu_backend.runs_on_cpu()
    monkeypatch.setenv("JAX_PLATFORMS", "tpu,cpu")
    assert not cpu_backend.runs_on_cpu()
