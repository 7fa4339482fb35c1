"""Hybrid retrieval for one query: dense over abstracts, dense over passages and tables, BM25 over
all chunks, fused with RRF. Abstracts get their own slice so the far larger passage population
cannot crowd paper-level summaries out."""

from __future__ import annotations

from pydantic import BaseModel

from arag.index.sparse import BM25Encoder
from arag.index.store import Store
from arag.models.embedder import BaseEmbedder
from arag.records import ChunkType, ScoredChunk, SearchFilter
from arag.retrieval.fusion import fuse_chunks
from arag.retrieval.resolve import PaperRef, PaperResolver
from arag.settings import RetrievalSettings


class HybridResult(BaseModel):
    """The fused list and the three lists it came from (for ``--explain`` and traces)."""

    fused: list[ScoredChunk]
    # The paper the question named, when it named one: the searches were scoped to it and ran
    # with ``query``, the question without the paper's name.
    resolved: PaperRef | None = None
    query: str = ""
    dense_abstracts: list[ScoredChunk]
    dense_passages: list[ScoredChunk]
    bm25: list[ScoredChunk]


def _with_types(flt: SearchFilter | None, types: list[ChunkType]) -> SearchFilter | None:
    """Narrow a filter to chunk types (intersecting any types it already names); None if empty."""
    wanted = [t for t in types if flt is None or flt.types is None or t in flt.types]
    if not wanted:
        return None
    base = flt or SearchFilter()
    return base.model_copy(update={"types": wanted})


class HybridRetriever:
    """Runs the three searches and fuses them; stateless apart from its collaborators."""

    def __init__(
        self,
        store: Store,
        embedder: BaseEmbedder,
        settings: RetrievalSettings,
        resolver: PaperResolver | None = None,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.settings = settings
        self.resolver = resolver
        self._bm25 = BM25Encoder()

    def search(self, query: str, flt: SearchFilter | None = None) -> HybridResult:
        """Hybrid search for one query, optionally filtered (papers, types, years, topics).

        Without an explicit paper filter, a question that names a paper is scoped to it.
        """
        s = self.settings
        resolved = None
        if self.resolver is not None and (flt is None or flt.paper_ids is None):
            resolved = self.resolver.resolve(query)
            if resolved is not None:
                flt = (flt or SearchFilter()).model_copy(update={"paper_ids": [resolved.paper_id]})
                query = resolved.remainder(query)
        vector = self.embedder.embed_query(query)
        abstract_flt = _with_types(flt, ["abstract"])
        passage_flt = _with_types(flt, ["passage", "table"])
        abstracts = self.store.dense_search(vector, s.abstract_k, abstract_flt) if abstract_flt else []
        passages = self.store.dense_search(vector, s.passage_k, passage_flt) if passage_flt else []
        terms = self._bm25.encode_query(query)
        # A query of stopwords alone has no BM25 terms; dense search still answers it.
        bm25 = self.store.sparse_search(terms, s.bm25_k, flt) if terms.indices else []
        fused = fuse_chunks([abstracts, passages, bm25], k=s.rrf_k, limit=s.fused_k)
        return HybridResult(
            fused=fused,
            resolved=resolved,
            query=query,
            dense_abstracts=abstracts,
            dense_passages=passages,
            bm25=bm25,
        )
