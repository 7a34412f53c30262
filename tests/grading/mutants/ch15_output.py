"""Plausible wrong answers to chapter 15's lab (the output stream); the graded tests must
catch each one. Each mutant replaces ``sample_stream``, the factory the engine and the
tests call, with one that makes a stream with one mistake: :class:`_Stream` is a correct
stream that decodes the whole output at every token, and each mutant changes one thing."""

from minillm.serve.detokenizer import held_back
from minillm.serve.sample_stream import Piece


class _Stream:
    def __init__(self, tokenizer, params):
        self.tokenizer, self.stops = tokenizer, list(params.stop)
        self.include = params.include_stop_str_in_output
        self.tokens, self.sent = [], 0

    def decode(self) -> str:
        return self.tokenizer.decode(self.tokens)

    def stop_in(self, text: str) -> tuple[int, str] | None:
        found = [(text.find(stop), stop) for stop in self.stops if stop in text]
        return min(found) if found else None

    def safe_end(self, text: str) -> int:
        if text.endswith("\ufffd"):
            return self.sent
        return len(text) - held_back(text, self.stops)

    def final_end(self, text: str) -> int:
        return len(text)

    def kept_logprobs(self, logprobs, kept: int) -> tuple:
        return tuple(logprobs[:kept])

    def finish_on_stop(self, finish_reason):
        return "stop"

    def find_stop(self, token_ids) -> tuple[int, tuple[int, str] | None]:
        """One token at a time: the tokens that count and the stop found (None: none)."""
        for count, token in enumerate(token_ids, start=1):
            self.tokens.append(token)
            if found := self.stop_in(self.decode()):
                return count, found
        return len(token_ids), None

    def push(self, token_ids, logprobs=(), finish_reason=None) -> Piece:
        kept, found = self.find_stop(token_ids)
        text = self.decode()
        if found is not None:
            at, stop = found
            finish_reason, end = self.finish_on_stop(finish_reason), at + len(stop) * self.include
        elif finish_reason is not None:
            end = self.final_end(text)
        else:
            end = self.safe_end(text)
        piece, self.sent = text[self.sent:end], max(self.sent, end)
        return Piece(piece, tuple(token_ids[:kept]), self.kept_logprobs(logprobs, kept),
                     finish_reason, found[1] if found else None)


class _Freezing(_Stream):
    def safe_end(self, text):
        if "\ufffd" in text[self.sent:]:  # an invalid byte's "\ufffd" never goes away
            return self.sent
        return super().safe_end(text)


def sample_stream__freezes_after_an_invalid_byte(tokenizer, params):
    """Waits while the unsent text holds any "\ufffd": after a byte that is never valid
    UTF-8 the stream sends nothing more until the reply ends."""
    return _Freezing(tokenizer, params)


class _Leaking(_Stream):
    def safe_end(self, text):
        return self.sent if text.endswith("\ufffd") else len(text)


def sample_stream__sends_what_may_start_a_stop_string(tokenizer, params):
    """Holds nothing back for stop strings: the first characters of one that spans tokens
    go out before the stream knows, and cannot be taken back."""
    return _Leaking(tokenizer, params)


class _LosingTail(_Stream):
    def final_end(self, text):
        return max(self.sent, self.safe_end(text))


def sample_stream__loses_the_held_back_tail(tokenizer, params):
    """At the end of the reply, keeps holding back what might have started a stop string
    (or a last "\ufffd"): the end of the text is never sent."""
    return _LosingTail(tokenizer, params)


class _DroppingStop(_Stream):
    def __init__(self, tokenizer, params):
        super().__init__(tokenizer, params)
        self.include = False


def sample_stream__ignores_include_stop_str_in_output(tokenizer, params):
    """Always cuts the text before the stop string, even with include_stop_str_in_output."""
    return _DroppingStop(tokenizer, params)


class _TokenByToken(_Stream):
    def decode(self):
        return "".join(self.tokenizer.decode([token]) for token in self.tokens)


def sample_stream__decodes_each_token_alone(tokenizer, params):
    """Decodes every token on its own and joins the pieces: a character split over tokens
    becomes several "\ufffd"."""
    return _TokenByToken(tokenizer, params)


class _LateLogprobs(_Stream):
    def __init__(self, tokenizer, params):
        super().__init__(tokenizer, params)
        self.late = ()

    def kept_logprobs(self, logprobs, kept):
        late, self.late = self.late, tuple(logprobs[:kept])
        return late


def sample_stream__logprobs_one_push_late(tokenizer, params):
    """Hands out each push's log-probabilities with the next push, as the text they go
    with is often sent a push later: they no longer belong to the piece's tokens."""
    return _LateLogprobs(tokenizer, params)


class _StopAtTheEnd(_Stream):
    def stop_in(self, text):
        found = [(len(text) - len(stop), stop) for stop in self.stops if text.endswith(stop)]
        return min(found) if found else None


def sample_stream__finds_a_stop_only_at_the_end(tokenizer, params):
    """Looks for a stop string only at the end of the text (endswith): one followed by more
    characters of the same token is missed."""
    return _StopAtTheEnd(tokenizer, params)


class _WholePush(_Stream):
    def find_stop(self, token_ids):
        self.tokens += token_ids
        found = self.stop_in(self.decode())
        return len(token_ids), found


def sample_stream__searches_the_whole_push_at_once(tokenizer, params):
    """Decodes a push of several tokens at once: every token of it counts even after the
    stop string, and a stop that starts earlier but ends later wins."""
    return _WholePush(tokenizer, params)


class _CoreFinishOnly(_Stream):
    def finish_on_stop(self, finish_reason):
        return finish_reason


def sample_stream__no_finish_reason_for_a_stop_string(tokenizer, params):
    """Reports only the core's finish reason: a stop string ends the text but not the
    sample, which the engine goes on generating."""
    return _CoreFinishOnly(tokenizer, params)

