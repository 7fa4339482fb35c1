"""The one settings tree. The only module that reads ``ARAG_*`` environment variables.

Sources, highest priority first: keyword arguments, environment (``ARAG_EMBEDDING__BATCH_SIZE=64``),
a TOML config file (``ARAG_CONFIG`` or ``<config dir>/arag/config.toml``), defaults.
Built by :func:`get_settings`, never at import time.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import platformdirs
from pydantic import BaseModel, Field, PrivateAttr, SecretStr, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from arag.errors import ConfigError

_REPO_ROOT = Path(__file__).resolve().parents[2]
# The most ARAG_AGENT__MAX_QUESTION_CHARS may allow: the API's schemas cap requests at this length.
QUESTION_CHARS_CEILING = 20_000
# API keys shorter than this are refused: a short key can be guessed.
MIN_API_KEY_CHARS = 32
# The shared data lives beside the repository (../shared); found from the package or the working dir.
_SHARED_CANDIDATES = (_REPO_ROOT.parent / "shared", Path.cwd().parent / "shared", Path.cwd() / "shared")


# A rebuild writes the next library generation beside the current one and switches by replacing
# this one file; without it the library lies in the data directory itself.
GENERATION_POINTER = "generation"
GENERATION_NAME = re.compile(r"^gen-\d{14}-[0-9a-f]{6}$")


def find_shared_dir() -> Path | None:
    """The ``../shared`` folder next to the repository, if present."""
    for cand in _SHARED_CANDIDATES:
        if (cand / "corpus").is_dir() or (cand / "benchmarks").is_dir():
            return cand.resolve()
    return None


def _default_qasper_path() -> Path:
    shared = find_shared_dir()
    if shared is not None:
        return shared / "corpus" / "qasper" / "papers.jsonl.gz"
    return Path(platformdirs.user_data_dir("arag")) / "corpus" / "qasper" / "papers.jsonl.gz"


# The llama.cpp builds a model process can run (arag.llm.builds).
LlamaBuild = Literal["auto", "portable", "avx512"]


class CorpusSettings(BaseModel):
    """Where the paper sources are."""

    qasper_path: Path = Field(default_factory=_default_qasper_path)
    # A limit for quick libraries (tests, benchmarks); None builds every paper.
    max_papers: int | None = None
    # Papers to take, by id, before max_papers applies (tests pick a few known papers).
    paper_ids: list[str] | None = None


class ChunkSettings(BaseModel):
    """Chunk sizes, in the embedding model's own word-pieces."""

    target_tokens: int = 200
    # Hard ceiling for embed_text (title + section prefix + text); the model reads 256 incl. [CLS]/[SEP].
    max_tokens: int = 254
    min_tokens: int = 20
    overlap_sentences: int = 2
    # Overlap is carried only inside a paragraph cut across chunks, and never more than this.
    overlap_max_tokens: int = 50


class EmbeddingSettings(BaseModel):
    """Which embedder, and how it runs."""

    provider: Literal["onnx-minilm", "sentence-transformers", "openai", "hash"] = "onnx-minilm"
    # For sentence-transformers: a hub id or a local path; for openai: the model name.
    model: str = "all-MiniLM-L6-v2"
    dim: int = 384
    batch_size: int = 32
    max_length: int = 256
    threads: int = 2
    # onnx-minilm only. dynamic: the packaged int8 weights re-quantised per output channel so the
    # matmuls run in int8 (MatMulInteger, ~1.7x faster on 2 cores, same retrieval quality: see the
    # README's *Figures*); weights: the packaged file as it is, dequantised to fp32 at load (the
    # model libraries built before dynamic existed were made with; they keep working with it).
    int8: Literal["dynamic", "weights"] = "dynamic"
    # onnx-minilm only: the folder of a model `arag train embedder` fine-tuned on QASPER train (it
    # writes <data dir>/models/embedder-trained); None: the packaged model. Another model is another
    # library: one built with the packaged model is refused under it (`arag library build --rebuild`).
    path: Path | None = None
    base_url: str | None = None
    api_key: SecretStr | None = None
    timeout_s: float = 60.0


class StoreSettings(BaseModel):
    """The index engine."""

    # edge: Qdrant Edge embedded in the process (the index lives in <data_dir>/index); qdrant: a Qdrant
    # server or cluster at qdrant_url (or qdrant-client's local mode); auto: qdrant when qdrant_url
    # is set, else edge.
    backend: Literal["auto", "edge", "qdrant"] = "auto"
    # qdrant only: the collection, and how it is laid out when arag creates it.
    collection: str = "arag"
    shards: int = Field(default=1, ge=1)
    replication_factor: int = Field(default=1, ge=1)
    # Papers embedded and written per step: bigger batches pad less, smaller ones lose less on a crash.
    papers_per_batch: int = 24

    @field_validator("backend", mode="before")
    @classmethod
    def _old_backend_name(cls, v: Any) -> Any:
        return "edge" if v == "qdrant-edge" else v  # the name before the qdrant backend existed


class RetrievalSettings(BaseModel):
    """Hybrid search: three searches over the one store, fused with RRF."""

    abstract_k: int = 5
    passage_k: int = 15
    bm25_k: int = 20
    fused_k: int = 25
    rrf_k: int = 60
    # How a query is searched: as asked (plain); with LLM rewrites fused by RRF (multi-query); or with
    # the vector of an LLM-written hypothetical answer passage for the dense searches (hyde). The last
    # two need an LLM (ARAG_LLM__PROVIDER) and cost a generation per query, slow on a CPU.
    strategy: Literal["plain", "multi-query", "hyde"] = "plain"
    # multi-query: rewrites asked for (the question itself is always searched too).
    variants: int = 3
    # A question that names no paper also ranks papers (retrieval/papers.py): wider searches than the
    # passage lists above (an open question's papers sit deeper than one paper's best passage), their
    # hits aggregated per paper, the top papers kept, each with its best passages reranked.
    paper_ranking: bool = True
    paper_abstract_k: int = 40
    paper_passage_k: int = 80
    paper_bm25_k: int = 80
    paper_abstract_bm25: bool = True
    papers_k: int = 10
    # Hits of one paper that count towards its score (each worth half the one before), and the best
    # of its chunks that are reranked and kept for it.
    paper_hits: int = 3
    passages_per_paper: int = 2


class RerankSettings(BaseModel):
    """The cross-encoder that reorders the fused candidates, and the bars that decide what is kept."""

    # trained: the ONNX model `arag train reranker` writes; cross-encoder: a sentence-transformers
    # CrossEncoder by hub name or path; none: keep the fused order.
    provider: Literal["trained", "cross-encoder", "none"] = "trained"
    model: str = "cross-encoder/ms-marco-MiniLM-L-6-v2"
    # The trained model's folder; default <data_dir>/models/reranker.
    path: Path | None = None
    # Word-pieces per (question, passage) pair at query time; None: the model card's (its calibration's).
    max_length: int | None = None
    threads: int = 2
    # At most this many chunks are kept as evidence.
    keep: int = 8
    # Candidates at fused ranks 1..supported_rank need the lower bar, the rest the upper bar.
    supported_rank: int = 10
    # None: the bars calibrated with the model (on the held-out train papers) and recorded in its card.
    lower_bar: float | None = None
    upper_bar: float | None = None
    # Weight of the fused rank in the final score (score + w * -ln rank); None: the model card's.
    fusion_weight: float | None = None
    mmr: bool = False
    mmr_lambda: float = 0.7
    # An arXiv manifest whose canonical papers get their rerank score floored at the lower bar.
    canonical_manifest: Path | None = None


class ReaderSettings(BaseModel):
    """The answer reader `arag train answers` trains (span, yes/no, answerable), used by the answer
    specialists after the verifier with the thresholds fit on held-out QASPER train papers."""

    # trained: the ONNX model in ``path`` (an error when it is missing); auto: that model when it is
    # installed (an answer's trace then has a ``specialists`` step), else none; none: the answers
    # stand as the verifier leaves them.
    provider: Literal["auto", "trained", "none"] = "auto"
    # The trained model's folder; default <data_dir>/models/reader.
    path: Path | None = None
    threads: int = 2


class AbstentionSettings(BaseModel):
    """The calibrated abstention after the verifier (``arag train abstention``)."""

    # auto: the fitted rule when one is stored (the step runs only when the rule is on); fitted:
    # require it (a missing one is an error naming the command); none: never decline after the verifier.
    provider: Literal["auto", "fitted", "none"] = "auto"
    # The rule's file; default <data_dir>/models/abstention.json.
    path: Path | None = None


class LLMSettings(BaseModel):
    """The language model that plans, grades and writes answers."""

    # llama-cpp: a local GGUF (default, offline); openai: any OpenAI-compatible endpoint;
    # extractive: no LLM, answers are the best-supported sentences of the kept passages.
    provider: Literal["llama-cpp", "openai", "extractive"] = "llama-cpp"
    # llama-cpp: a packaged model name (qwen2.5-coder-1.5b, qwen2.5-coder-0.5b) or a .gguf path;
    # openai: the model name the endpoint knows.
    model: str = "qwen2.5-coder-1.5b"
    base_url: str | None = None
    # The name of the environment variable that holds the API key (never the key itself).
    api_key_env: str = "OPENAI_API_KEY"
    context_tokens: int = 4096
    max_answer_tokens: int = 320
    threads: int = 2
    temperature: float = 0.0
    seed: int = 0
    timeout_s: float = 120.0
    # llama-cpp: layers offloaded to a GPU (0: CPU only; -1: all), when llama.cpp was built with one.
    gpu_layers: int = 0
    # llama-cpp: model processes, each with threads // processes threads and one request at a time
    # (`arag bench service` compares 1 and 2 on 2 cores: see the README).
    processes: int = Field(default=1, ge=1, le=16)
    # llama-cpp: the llama.cpp build the model processes run (llm/builds.py). auto: one compiled for
    # this CPU's AVX-512 where set-up installed it and `arag llm check --build all` passed with it
    # on this CPU, else the portable one; portable; avx512 (an error where it cannot run).
    build: LlamaBuild = "auto"
    # llama-cpp: how long a model process may take to load, and a request to wait for a free one.
    start_timeout_s: float = 180.0
    queue_timeout_s: float = 900.0
    # openai: retries on 429/5xx and dropped connections, with doubling backoff from backoff_s.
    retries: int = 2
    backoff_s: float = 1.0
    # Keep replies in <data dir>/cache/llm.sqlite3, keyed by backend, model, prompt and parameters:
    # at temperature 0 the same call gives the same reply, so reruns cost nothing.
    cache: bool = True


class TopicSettings(BaseModel):
    """Topic clustering of abstract vectors."""

    k: int = 20
    seed: int = 0
    label_terms: int = 4
    # The map of the library (library/map.py): t-SNE over the abstract vectors, or PCA.
    map_method: Literal["tsne", "pca"] = "tsne"


class ArxivSettings(BaseModel):
    """The arXiv API client used by ``arag corpus select`` / ``fetch``."""

    api_url: str = "https://export.arxiv.org/api/query"
    pdf_url: str = "https://arxiv.org/pdf/{id}"
    delay_s: float = 3.0
    retries: int = 4
    backoff_s: float = 2.0
    timeout_s: float = 30.0


# ARAG_AGENT__ANSWER_CONFIDENCE's values from when it was a boolean.
_OLD_BOOLEANS = {"true": "on", "1": "on", "yes": "on", "false": "off", "0": "off", "no": "off"}


class AgentSettings(BaseModel):
    """The answering agent: planning, grading, the retry, the context budget and verification."""

    # The longest question or search query any entry point takes (CLI, Python API, HTTP API, MCP).
    max_question_chars: int = Field(default=2000, ge=1, le=QUESTION_CHARS_CEILING)
    # Sub-queries of a compound question, and retrieval passes after the first (at most one retry).
    max_sub_queries: int = 3
    max_retries: int = 1
    # Ask the LLM to decompose questions that look compound (rules otherwise, and on bad JSON).
    plan_with_llm: bool = True
    reformulate_with_llm: bool = True
    # LLM checks (the grader's sufficiency check, the LLM-judge verifier): auto = only with a hosted
    # (openai) model; a 1.5B local model is too unreliable a judge to be worth its latency.
    llm_checks: Literal["auto", "on", "off"] = "auto"
    # Claim support: combined (the cross-encoder `arag train support` builds and the lexical overlap,
    # weighed by a fit in its card), trained (the cross-encoder alone), lexical (content-word overlap),
    # llm-judge, nli (a sentence-transformers NLI cross-encoder, support_model), or auto: the LLM judge
    # with LLM checks, else lexical (see make_support for why combined is not the default).
    support: Literal["auto", "combined", "trained", "lexical", "llm-judge", "nli"] = "auto"
    # The lexical and nli scorers' threshold; 0.44 is the lexical scorer's best F1 on QASPER train's
    # supported/unsupported pairs (0.619 at 0.443 over 2,101 questions; two-fold 0.617), measured by
    # `arag train support --lexical --validation <train questions>` (the scorer learns nothing, so all
    # of train is held out from it; validation is only reported on).
    support_threshold: float = 0.44
    support_model: str = "cross-encoder/nli-deberta-v3-base"
    # The trained support model's folder; default <data_dir>/models/support.
    support_path: Path | None = None
    # Share of the question's key terms the kept passages must hold: below min_coverage the context
    # is partial, below unrelated_coverage the question is off the library's topics.
    min_coverage: float = 0.6
    unrelated_coverage: float = 0.3
    # Context: at most this many passages, pruned to the sentences that bear on the question (plus
    # this many following sentences), capped in the LLM's own tokens.
    max_passages: int = 8
    # Prefill dominates latency on a CPU (the 1.5B reads 60 to 100 tokens/s on 2 cores), and a 1.5B
    # answers no worse from less: on the held-out train papers' 150 questions 600 scored 0.266
    # Answer-F1, 900 0.250 and 450 0.240 (README, *The context's size*). A hosted LLM may take more.
    context_tokens: int = 600
    neighbour_sentences: int = 1
    # Room kept for the prompt's instructions around the passages.
    prompt_reserve_tokens: int = 400
    extractive_sentences: int = 3
    # Unsupported claims are dropped, or kept and marked.
    unsupported: Literal["drop", "mark"] = "drop"
    # When the LLM says "not in the library" but the grader found the context sufficient, answer
    # extractively instead (a small model's false abstentions cost as much as retrieval misses).
    override_false_abstain: bool = True
    # After an LLM answer, the model's probability of starting its short answer with "not" (in the
    # library): signals for calibrated abstention. Local models only (a hosted API has no such call;
    # the signals are then absent). It is one more model call, so ``auto`` makes it only where it is
    # read: an abstention rule that is on and weighs them, or traces written for fitting one.
    answer_confidence: Literal["auto", "on", "off"] = "auto"
    closest_papers: int = 3
    concurrent: bool = True
    # An open question (it names no paper): at most this many papers in its literature answer, and an
    # LLM overview of their points (two or three cited sentences) above the grouped points. The
    # overview is the answer's one generation: ~300 prompt tokens (six points, 25 words each) and at
    # most 90 generated, ~11 s with the local 1.5B on 2 idle cores.
    literature_papers: int = 8
    # A paper's aggregated evidence must be at least this share of the best paper's to be cited.
    literature_min_score: float = 0.45
    # Passages of each paper numbered in its context (its point is drawn from one of them).
    literature_passages: int = 3
    literature_overview: bool = True
    overview_tokens: int = 90

    @field_validator("answer_confidence", mode="before")
    @classmethod
    def _confidence_was_a_bool(cls, v: Any) -> Any:
        # It was a boolean before ``auto``: true/false (and 1/0) still mean on/off.
        if isinstance(v, bool):
            return "on" if v else "off"
        if isinstance(v, str):
            return _OLD_BOOLEANS.get(v.strip().lower(), v)
        return v


class ChatSettings(BaseModel):
    """Conversations (``arag chat``): how follow-ups become standalone questions."""

    # Rewrite follow-ups with the LLM when there is one (rules otherwise, and on an unusable reply).
    rewrite_with_llm: bool = True
    # Earlier exchanges of the session the LLM rewriter reads.
    history_turns: int = 3


class ServiceSettings(BaseModel):
    """The HTTP service (``arag serve``)."""

    host: str = "127.0.0.1"
    port: int = Field(default=7860, ge=1, le=65535)
    # Questions answered at once (threads; the local LLM takes one at a time, retrieval overlaps).
    workers: int = Field(default=4, ge=1)
    # Requests waiting for a worker before new ones get 503 (retry later).
    queue_size: int = Field(default=16, ge=0)
    # Searches (retrieval only, tens of ms) run in a pool of their own: never queued behind answers
    # that wait for the LLM.
    search_workers: int = Field(default=2, ge=1)
    # Requests per key per minute when API keys are on (ARAG_API_KEYS); 0: no limit.
    rate_limit_per_minute: int = Field(default=60, ge=0)
    # Origins allowed to call the API from a browser (CORS). Empty: the page the app serves only.
    cors_origins: list[str] = Field(default_factory=list)
    max_upload_mb: float = Field(default=50.0, gt=0)
    max_upload_files: int = Field(default=20, ge=1)
    # Finished ingest jobs remembered for GET /ingest/{id}.
    jobs_kept: int = Field(default=100, ge=1)
    # The largest JSON request body, in kB (a question of the longest length fits many times over);
    # POST /ingest may send max_upload_files x max_upload_mb (+1 MB of form). Counted as it streams.
    max_body_kb: int = Field(default=256, ge=1)
    # Host names the service answers to besides the loopback names and `host` (behind a proxy, or a
    # DNS name for a non-loopback address). Other Host headers get 400: DNS rebinding needs a name of
    # the attacker's. With `host` 0.0.0.0 and no names here, any Host is accepted (keys are required).
    allowed_hosts: list[str] = Field(default_factory=list)
    # Wrong API keys one client may send in a minute before it gets 429 (keys on only).
    key_failures_per_minute: int = Field(default=10, ge=1)

    # arag serve builds an empty or interrupted default library in the background while it answers
    # over what is indexed so far, then trains the reranker (searches use the fused order until then).
    build_library: bool = True
    train_reranker: bool = True
    # The nice value of that background work (per thread): on 2 cores, questions come first.
    background_nice: int = Field(default=19, ge=0, le=19)


class PdfSettings(BaseModel):
    """Limits on one PDF's parse (``arag library add``, ``POST /ingest``): a hostile or broken file is
    rejected with the limit it hit, never parsed at any cost inside the server."""

    max_pages: int = Field(default=300, ge=1)
    # Each PDF is parsed in a child process with this much address space and time.
    parse_memory_mb: int = Field(default=2048, ge=64)
    parse_timeout_s: float = Field(default=120.0, gt=0)


class Settings(BaseSettings):
    """All of arag's settings."""

    model_config = SettingsConfigDict(
        env_prefix="ARAG_",
        env_nested_delimiter="__",
        extra="forbid",
    )

    data_dir: Path = Field(default_factory=lambda: Path(platformdirs.user_data_dir("arag")))
    threads: int = 2
    log_level: str = "WARNING"
    corpus: CorpusSettings = Field(default_factory=CorpusSettings)
    chunking: ChunkSettings = Field(default_factory=ChunkSettings)
    embedding: EmbeddingSettings = Field(default_factory=EmbeddingSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    # A Qdrant server or cluster (http://host:6333) for the qdrant store backend; ":memory:" or
    # "path:/some/dir" use qdrant-client's local mode (tests, small experiments).
    qdrant_url: str | None = None
    qdrant_api_key: SecretStr | None = None
    topics: TopicSettings = Field(default_factory=TopicSettings)
    retrieval: RetrievalSettings = Field(default_factory=RetrievalSettings)
    rerank: RerankSettings = Field(default_factory=RerankSettings)
    reader: ReaderSettings = Field(default_factory=ReaderSettings)
    abstention: AbstentionSettings = Field(default_factory=AbstentionSettings)
    llm: LLMSettings = Field(default_factory=LLMSettings)
    arxiv: ArxivSettings = Field(default_factory=ArxivSettings)
    agent: AgentSettings = Field(default_factory=AgentSettings)
    chat: ChatSettings = Field(default_factory=ChatSettings)
    service: ServiceSettings = Field(default_factory=ServiceSettings)
    pdf: PdfSettings = Field(default_factory=PdfSettings)
    # API keys of the service, comma-separated (ARAG_API_KEYS). Unset: no key needed (local use).
    api_keys: SecretStr | None = None
    # A generation pinned by at_generation (the one a rebuild writes); None: the pointer decides.
    _generation: str | None = PrivateAttr(default=None)

    @field_validator("api_keys")
    @classmethod
    def _long_keys(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None:
            check_api_keys(v.get_secret_value())
        return v

    @field_validator("data_dir")
    @classmethod
    def _expand(cls, v: Path) -> Path:
        return v.expanduser()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = config_path()
        if config_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=config_file))
        return tuple(sources)

    # Derived locations inside the data directory.
    def service_keys(self) -> frozenset[str]:
        """The API keys in force (empty: authentication is off)."""
        return check_api_keys(self.api_keys.get_secret_value() if self.api_keys is not None else "")

    @property
    def uploads_dir(self) -> Path:
        return self.data_dir / "uploads"

    def generation(self) -> str:
        """The library generation in force: the name in ``<data dir>/generation``, or "" for a
        library in the data directory itself (never rebuilt)."""
        if self._generation is not None:
            return self._generation
        pointer = self.data_dir / GENERATION_POINTER
        try:
            name = pointer.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return ""
        except OSError as exc:
            raise ConfigError(
                f"the library's generation pointer is unreadable: {exc}",
                where=str(pointer),
                fix="make it readable; it names a folder of <data dir>/generations",
            ) from exc
        if not GENERATION_NAME.match(name):
            raise ConfigError(
                f"the library's generation pointer names {name[:40]!r}, not a generation",
                where=str(pointer),
                fix="write the name of the newest folder of <data dir>/generations into it",
            )
        return name

    def at_generation(self, name: str) -> Settings:
        """These settings with the library in generation ``name`` (what a rebuild writes)."""
        copy = self.model_copy()
        copy._generation = name
        return copy

    @property
    def library_dir(self) -> Path:
        """The folder of the current library generation (its index and build state)."""
        gen = self.generation()
        return self.data_dir / "generations" / gen if gen else self.data_dir

    @property
    def index_dir(self) -> Path:
        return self.library_dir / "index"

    @property
    def state_db(self) -> Path:
        return self.library_dir / "library.sqlite3"

    @property
    def collection(self) -> str:
        """The Qdrant collection of the current generation (the qdrant backend)."""
        gen = self.generation()
        return f"{self.store.collection}-{gen}" if gen else self.store.collection

    @property
    def qdrant_key(self) -> str | None:
        """The Qdrant API key in clear, for the client (None without one)."""
        return self.qdrant_api_key.get_secret_value() if self.qdrant_api_key is not None else None

    @property
    def cache_dir(self) -> Path:
        return self.data_dir / "cache"

    @property
    def llm_cache_db(self) -> Path:
        return self.cache_dir / "llm.sqlite3"

    @property
    def embedding_cache_db(self) -> Path:
        return self.cache_dir / "embeddings.sqlite3"

    @property
    def logs_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def embedder_dir(self) -> Path:
        """Where an embedding model derived from a packaged one is kept (the dynamic int8 MiniLM)."""
        return self.data_dir / "models" / "embedder"

    @property
    def trained_embedder_dir(self) -> Path:
        """Where `arag train embedder` installs its model (used only when ARAG_EMBEDDING__PATH names it)."""
        return self.embedding.path or self.data_dir / "models" / "embedder-trained"

    @property
    def reranker_dir(self) -> Path:
        return self.rerank.path or self.data_dir / "models" / "reranker"

    @property
    def reader_dir(self) -> Path:
        return self.reader.path or self.data_dir / "models" / "reader"

    @property
    def abstention_path(self) -> Path:
        return self.abstention.path or self.data_dir / "models" / "abstention.json"

    @property
    def support_dir(self) -> Path:
        return self.agent.support_path or self.data_dir / "models" / "support"


def check_api_keys(raw: str) -> frozenset[str]:
    """The comma-separated keys; a ConfigError when one is shorter than MIN_API_KEY_CHARS."""
    keys = frozenset(k.strip() for k in raw.split(",") if k.strip())
    short = sorted(len(k) for k in keys if len(k) < MIN_API_KEY_CHARS)
    if short:
        raise ConfigError(
            f"{len(short)} of the {len(keys)} API keys in ARAG_API_KEYS are shorter than "
            f"{MIN_API_KEY_CHARS} characters ({', '.join(map(str, short))}): a short key can be guessed",
            where="ARAG_API_KEYS",
            fix="use keys of 32 characters or more, e.g. from "
            "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`",
        )
    return keys


def config_path() -> Path | None:
    """The TOML config file in force, if any (``ARAG_CONFIG`` wins over the default location)."""
    explicit = os.environ.get("ARAG_CONFIG")
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"config file {path} does not exist",
                where="ARAG_CONFIG",
                fix="point ARAG_CONFIG at an existing TOML file, or unset it",
            )
        return path
    default = Path(platformdirs.user_config_dir("arag")) / "config.toml"
    return default if default.is_file() else None


def get_settings(**overrides: Any) -> Settings:
    """Build the settings from overrides, the environment and the config file."""
    try:
        return Settings(**overrides)
    except ConfigError:
        raise
    except Exception as exc:  # pydantic ValidationError: say which setting is wrong
        raise ConfigError(
            f"invalid settings: {exc}",
            where="ARAG_* environment / config file",
            fix="correct or unset the setting named above",
        ) from exc
