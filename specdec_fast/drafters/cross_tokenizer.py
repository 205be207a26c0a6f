"""CrossTokenizerDrafter: a draft model with ANOTHER tokenizer than the target's (transformers'
"universal assisted generation"). Its proposals are turned into text, re-encoded into the
target's tokens and verified as deterministic drafts (draft_logits None: p = one-hot, so the
output follows the target exactly, greedy or sampled).

Protocol: drafters/model.py (start / propose / commit / compact). Host work every iteration (the
tokenisers run on the host, and the new tokens are read from the device), so ``graph_safe`` is
False: the engine runs such calls eagerly and says why in the stats' graph_note.

Per row the drafter keeps, on the host:
  text        the bytes of every real target token so far (prompt, then the emitted tokens), from
              token_bytes.TokenBytes tables: appending a token is a table look-up, and a
              multi-byte character split over two target tokens stays exact (no decode());
  the draft's own context, in ITS tokens: the draft runner's cache holds committed tokens that
              cover text[:committed_bytes] (always a character boundary), then tentative tokens
              fed last iteration.
propose(K), per row:
  1. read the target's new tokens (state.seq up to state.end) and append their bytes;
  2. re-encode text[committed_bytes:] (its whole characters) with the draft's tokenizer: the tail
     at the boundary, re-tokenised with the new text (transformers' assistant_lookbehind window,
     but cut at an exact byte offset instead of matched back by a longest common diagonal);
  3. commit the tentative tokens fed last time that this encoding confirms (drafts the target
     accepted are kept, as ModelDrafter keeps them), up to the text's stable boundary: later
     text can re-tokenise its last two pre-tokens (a word that grows, a whitespace run that gives
     its last space to the next word: TokenBytes.stable_bytes), so their tokens stay tentative
     (a tokenizer without a pre-tokenizer: the last ``hold`` tokens); feed the rest in one
     left-padded call: its last logits give the first draft. Committed tokens are final, so the
     draft's context is its own canonical tokenisation of the text (checked token by token over
     held-out code in tests/engine/test_cross_tokenizer_text.py; a fixed 1-2 token lookbehind
     left random-cut text non-canonical);
  4. draft up to ``steps`` tokens greedily (argmax; sample_drafts=True samples with the call's
     temperature / top-k / top-p through the fused ``sample`` kernel), one call each;
  5. the drafted bytes continue the text from the target's boundary: re-encode them with the
     target's tokenizer, drop the last target token (the draft may have stopped inside it)
     unless the draft ended its text (its EOS: the target's EOS follows), and hand the first K
     to the verify (-1 pads). Where the target's text ends inside a character (a byte token),
     the draft must reproduce those bytes and the character's remaining bytes go as the target's
     one-byte tokens.
A row stops drafting as soon as its text makes K + 1 target tokens (one target encode per row and
step: ~15 us against ~0.45 ms for a step of the demo-sized draft on CPU), at most
steps = ceil((K + 1) * r) + 1, r = the prompt's draft tokens per target token (1 to 3).

The draft model runs through the package's runner for it (runners/registry.py choose_runner /
make_runner: the paged runner for Llama-family and GPT-2 drafts, the hf runner otherwise), with
the runner interface's prefill / score(tokens, num_valid) / commit(keep): per-row ragged feeds
and per-row rollback of unconfirmed tokens are what score's num_valid and commit's keep already
do. Its KV memory is sized per call (not the engine's pool, which counts target tokens): each
row reserves its draft prompt + ceil(max_new_tokens * 2r) + 16 tokens + the most one iteration
feeds; a row that would outgrow it stops drafting (its later iterations verify no drafts: exact,
slower).
"""
import dataclasses
import math

import torch

from ..kernels.rng import STREAM_DRAFT
from ..kernels.verify import prepared_impls
from .token_bytes import TokenBytes, incomplete_tail, is_char_start

HOLD = 2  # tokens kept tentative for a draft tokenizer without a pre-tokenizer (module docstring, 3.)
MAX_RATIO = 3.0  # draft tokens per target token, for the draft steps and the KV reservation


@dataclasses.dataclass
class _Row:
    text: bytearray
    seen: int  # state.seq index up to which target tokens are in text
    committed_bytes: int = 0  # text covered by the draft's committed tokens
    committed: int = 0  # draft tokens committed (prefix tokens included)
    budget: int = 0  # draft tokens this row's KV reservation holds
    fed: list = dataclasses.field(default_factory=list)  # tentative draft tokens fed since the last commit
    active: bool = True  # False: drafts nothing for the rest of the call


class CrossTokenizerDrafter:
    """Drafts for ``target`` with a draft model of another tokenizer. runner: the draft model's
    runner (paged or hf); tokenizer / assistant_tokenizer: the target's and the draft's (or their
    TokenBytes). hold: draft tokens kept tentative at the text's end when the draft's tokenizer
    has no pre-tokenizer to place its stable boundary; sample_drafts: sample the
    drafts in the draft's vocabulary instead of taking its argmax (default: argmax, which also
    maximises a one-hot draft's acceptance q(x) when sampling)."""

    graph_safe = False
    needs_compact = False  # an hf runner is compacted here, with a bound in draft tokens
    graph_note = "a draft with another tokenizer re-tokenises on the host every iteration (no CUDA graph can)"

    def __init__(self, runner, tokenizer, assistant_tokenizer, *, hold: int = HOLD, sample_drafts: bool = False):
        if isinstance(hold, bool) or not isinstance(hold, int) or hold < 1:
            raise ValueError(f"hold must be an int >= 1, got {hold!r}")
        self.runner = runner
        self.target_codec = tokenizer if isinstance(tokenizer, TokenBytes) else TokenBytes(tokenizer)
        self.draft_codec = assistant_tokenizer if isinstance(assistant_tokenizer, TokenBytes) else TokenBytes(assistant_tokenizer)
        self.hold, self.sample_drafts = hold, sample_drafts
        self.vocab_size = None  # drafts are target ids, with no draft logits
        draft = self.draft_codec
        start = draft.prefix_ids or [t for t in (draft.tokenizer.bos_token_id, draft.eos_id) if t is not None][:1]
        self._start_ids = list(start)  # before a row's text (a row with no text still needs one token)
        self._stop_ids = draft.special | ({draft.eos_id} if draft.eos_id is not None else set())  # end a row's drafts

    # -- the call's start --------------------------------------------------------------------
    def start(self, state, prompt) -> None:
        """After the target's prefill and first token: each row's text from its real prompt
        tokens, the draft's prompt (its tokens of that text, the last ``hold`` held back) into the
        draft runner."""
        self.state, self.k = state, prompt.k
        ids, mask = prompt.ids.cpu(), prompt.mask.cpu()
        width = ids.shape[1]
        tcodec, dcodec = self.target_codec, self.draft_codec
        self.rows, draft_prompts = [], []
        target_tokens = draft_tokens = 0
        for b in range(ids.shape[0]):
            real = ids[b][mask[b].bool()].tolist()
            row = _Row(bytearray(tcodec.bytes_of(real)), width)
            text = bytes(row.text[: len(row.text) - incomplete_tail(row.text)])
            tail = dcodec.encode(text)
            context = self._start_ids + tail
            n = len(self._start_ids) + self._committable(text, tail)
            n = min(max(n, 1), len(context))  # the prefill needs a token
            row.active = bool(real) and n > 0 and is_char_start(text, len(dcodec.bytes_of(context[:n])))
            if row.active:
                row.committed, row.committed_bytes = n, len(dcodec.bytes_of(context[:n]))
                target_tokens, draft_tokens = target_tokens + len(real), draft_tokens + len(tail)
            self.rows.append(row)
            draft_prompts.append(context[:n] if row.active else [])
        self.ratio = min(max(draft_tokens / max(target_tokens, 1), 1.0), MAX_RATIO)
        self.steps = self._steps_for(self.k)  # prompt.k: the most drafts an iteration of this call asks for
        # The most one iteration feeds: the held tokens and K + 1 target tokens' text, re-encoded
        # (a draft token holds >= 1 byte), then steps - 1 drafts.
        self.max_feed = self.hold * dcodec.max_token_bytes + (self.k + 1) * tcodec.max_token_bytes
        tentative = self.max_feed + self.steps
        # The call's max_new_tokens, from a used row's KV budget (real prompt + max_new_tokens + K + 1).
        max_new = max([budget - int(m.sum()) - self.k - 1 for budget, m in zip(prompt.budgets, mask) if m.any()] or [0])
        limit = getattr(self.runner, "max_positions", None)  # learned positions (GPT-2): a hard limit
        for b, (row, p) in enumerate(zip(self.rows, draft_prompts)):
            row.budget = len(p) + math.ceil(max_new * 2 * self.ratio) + 16 + tentative if row.active else 0
            row.budget = min(row.budget, limit or row.budget)
            if row.active and len(p) + tentative > row.budget:  # no room to draft at all
                row.active, row.budget, draft_prompts[b] = False, 0, []
        self._prefill(draft_prompts, tentative)
        dev = state.seq.device
        self._sample = prepared_impls(state.backend, dev)[1] if self.sample_drafts else None
        self._params = dataclasses.replace(state.params, offset=state.gen_len)
        self._greedy = not self.sample_drafts or state.params.modes == {"greedy"}
        self._positions = [torch.full((len(self.rows),), i, dtype=torch.long, device=dev) for i in range(self.steps)]

    def _steps_for(self, k: int) -> int:
        """Draft steps at most in an iteration that asks for k target drafts."""
        return math.ceil((k + 1) * self.ratio) + 1

    def _prefill(self, prompts: list, tentative: int) -> None:
        width = max(1, max(len(p) for p in prompts))
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        mask = torch.zeros(len(prompts), width, dtype=torch.long)
        for b, p in enumerate(prompts):
            if p:
                ids[b, width - len(p):] = torch.tensor(p)
                mask[b, width - len(p):] = 1
        dev = self.state.seq.device
        self.runner.prefill(ids.to(dev), mask.to(dev), budgets=[row.budget for row in self.rows],
                            num_draft_tokens=tentative - 1)

    # -- one iteration -------------------------------------------------------------------------
    def propose(self, k: int):
        """-> drafts [B, k] int64 (target ids, -1 pads), None (deterministic drafts: p = one-hot)."""
        rows = self.rows
        feeds = self._read_new_text()
        keep = [0] * len(rows)
        for b, row in enumerate(rows):
            feeds[b] = self._refresh(row, keep, b) if feeds[b] else []
        self.runner.commit(torch.tensor(keep, device=self.state.seq.device))
        if getattr(self.runner, "needs_compact", False):
            self.runner.compact(max(row.committed for row in rows))
        drafted = self._draft(feeds, k)
        drafts = torch.full((len(rows), k), -1, dtype=torch.long)
        for b, row in enumerate(rows):
            if drafted[b] is not None:
                ids = self._to_target(row, *drafted[b])[:k]
                drafts[b, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        return drafts.to(self.state.seq.device), None

    def _read_new_text(self) -> list:
        """Appends each live row's new target tokens' bytes to its text (one copy of the new part
        of state.seq). -> per row: True when the row drafts this iteration."""
        st, rows = self.state, self.rows
        live = st.live.tolist()
        ends = st.end.tolist()
        lo, hi = min(row.seen for row in rows), max(ends)
        chunk = st.seq[:, lo:hi].tolist() if hi > lo else [[] for _ in rows]
        out = []
        for b, row in enumerate(rows):
            if ends[b] > row.seen:
                row.text += self.target_codec.bytes_of(chunk[b][row.seen - lo: ends[b] - lo])
                row.seen = ends[b]
            out.append(bool(live[b]) and row.active)
            if not out[-1]:
                row.fed = []  # committed as 0 below
        return out

    def _refresh(self, row: _Row, keep: list, b: int) -> list:
        """Re-encodes the row's text after its committed tokens; sets keep[b] (the tentative tokens
        fed last time that the encoding confirms, less the last ``hold``) -> the tokens to feed."""
        dcodec = self.draft_codec
        text = row.text
        complete = len(text) - incomplete_tail(text)
        window = bytes(text[row.committed_bytes: complete])
        tail = dcodec.encode(window)
        same = 0
        for a, c in zip(tail, row.fed):
            if a != c:
                break
            same += 1
        n = min(same, self._committable(window, tail))
        keep[b] = n
        row.committed += n
        row.committed_bytes += len(dcodec.bytes_of(tail[:n]))
        feed = tail[n:]
        if not feed or len(feed) > self.max_feed or row.committed + len(feed) + self.steps > row.budget:
            row.fed = []
            if feed:
                row.active = False  # outgrew its reservation: no more drafts this call (exact, slower)
            return []
        row.fed = list(feed)
        return feed

    def _committable(self, window: bytes, tail: list) -> int:
        """How many of ``tail`` (the draft's tokens of ``window``, text from the committed boundary)
        no later text can change: those within the stable boundary (else all but ``hold``), ending
        on a character boundary, never the last (its logits give the first draft)."""
        dcodec = self.draft_codec
        stable = dcodec.stable_bytes(window)
        n, at = 0, 0
        limit = len(tail) - (1 if stable is not None else self.hold)
        for token in tail[: max(limit, 0)]:
            at += len(dcodec.table[token])
            if stable is not None and at > stable:
                break
            n += 1
        while n > 0 and not is_char_start(window, len(dcodec.bytes_of(tail[:n]))):
            n -= 1  # its text is re-encoded from there: whole characters only
        return n

    def _draft(self, feeds: list, k: int) -> list:
        """One left-padded call feeding each row its tokens, then up to _steps_for(k) one-token
        steps (k: this iteration's K, at most the call's: an adaptive schedule varies it).
        -> per row: (drafted draft ids, ended by the draft's EOS) or None (no drafts)."""
        rows, dev = self.rows, self.state.seq.device
        if not any(feeds):
            return [None] * len(rows)
        steps = min(self._steps_for(k), self.steps)
        width = max(len(f) for f in feeds)
        tokens = torch.zeros(len(rows), width, dtype=torch.long)
        for b, f in enumerate(feeds):
            if f:
                tokens[b, width - len(f):] = torch.tensor(f)
        valid = torch.tensor([len(f) for f in feeds])
        logits = self.runner.score(tokens.to(dev), valid.to(dev))[:, -1]
        going = [bool(f) for f in feeds]
        out = [([], False) if g else None for g in going]
        for i in range(steps):
            if self._greedy:
                picked = logits.argmax(-1)
            else:
                picked = self._sample(logits, self._params, self._positions[i], STREAM_DRAFT)
            picked = picked.tolist()
            for b, token in enumerate(picked):
                if going[b]:
                    ids, _ = out[b]
                    if token in self._stop_ids or token >= len(self.draft_codec.table):
                        out[b], going[b] = (ids, token == self.draft_codec.eos_id), False
                    else:
                        ids.append(token)
                        # Enough text for K target tokens (and the one _to_target drops): this row stops.
                        going[b] = len(self._to_target(rows[b], ids, False)) < k
            if i + 1 == steps or not any(going):
                break
            step = torch.tensor([t if g else 0 for t, g in zip(picked, going)], dtype=torch.long)
            for b, g in enumerate(going):
                if g:
                    rows[b].fed.append(picked[b])
            logits = self.runner.score(step[:, None].to(dev), torch.tensor(going, dtype=torch.long).to(dev))[:, -1]
        return out

    def _to_target(self, row: _Row, draft_ids: list, ended: bool) -> list:
        """The drafted text, from the target's boundary, as target ids (module docstring, 5.)."""
        tcodec = self.target_codec
        text = self.draft_codec.bytes_of(draft_ids)
        pending = bytes(row.text[len(row.text) - incomplete_tail(row.text):])
        if not text.startswith(pending):
            return []
        text = text[len(pending):]  # where the target's text ends inside a character, the rest of it
        whole = text[: len(text) - incomplete_tail(text)]  # leads with bytes that are no character: one-byte tokens
        ids = tcodec.encode(whole)
        if ended and whole == text and tcodec.bytes_of(ids) == whole:  # the draft ended its text: so may the target
            return ids + ([tcodec.eos_id] if tcodec.eos_id is not None else [])
        return ids[:-1]

    def commit(self, num_accepted: torch.Tensor, draft_tokens: torch.Tensor) -> None:
        """Nothing: the next propose reads the emitted tokens from state.seq."""

    def compact(self, max_len_bound: int) -> None:
        """Nothing: an hf draft runner is compacted in propose (its bound is in draft tokens)."""
