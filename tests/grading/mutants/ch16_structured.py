"""Plausible wrong answers to chapter 16 (structured output); the graded tests must catch
each one. Each mutant replaces the solution function named before its ``__``."""

import torch

# -- 16.1 token_mask ----------------------------------------------------------------------------


def token_mask__first_char_only(automaton, state, texts):
    """Checks only the token's first character: lets "4a" into a number."""
    return torch.tensor([bool(text) and automaton.step(state, text[0]) is not None
                         for text in texts], dtype=torch.bool)


def token_mask__allows_empty(automaton, state, texts):
    """Allows the empty text: walking nothing stays alive, so the model could stall."""
    return torch.tensor([text is not None and automaton.walk(state, text) is not None
                         for text in texts], dtype=torch.bool)


def token_mask__none_as_empty(automaton, state, texts):
    """Reads a None text (a control token, half a character) as "" and so allows it."""
    return torch.tensor([automaton.walk(state, text or "") is not None for text in texts],
                        dtype=torch.bool)


def token_mask__must_end_accepting(automaton, state, texts):
    """Requires the token to end in an accepting state: "-" can no longer start "-42"."""
    allowed = []
    for text in texts:
        end = automaton.walk(state, text) if text else None
        allowed.append(end is not None and automaton.is_accepting(end))
    return torch.tensor(allowed, dtype=torch.bool)


def token_mask__step_whole_token(automaton, state, texts):
    """Steps once with the whole token as if it were one character: only one-character
    tokens can ever pass."""
    allowed = []
    for text in texts:
        try:
            allowed.append(bool(text) and automaton.step(state, text) is not None)
        except TypeError:  # ord() of a longer string
            allowed.append(False)
    return torch.tensor(allowed, dtype=torch.bool)


def token_mask__all_but_last_char(automaton, state, texts):
    """Off by one: walks every character but the last (``text[:-1]``)."""
    return torch.tensor([bool(text) and automaton.walk(state, text[:-1]) is not None
                         for text in texts], dtype=torch.bool)


def token_mask__from_the_start(automaton, state, texts):
    """Walks each token from the automaton's initial state, not from ``state``."""
    return torch.tensor([bool(text) and automaton.walk(automaton.initial, text) is not None
                         for text in texts], dtype=torch.bool)


def token_mask__last_char_only(automaton, state, texts):
    """Checks only the token's last character (as if the token were one character)."""
    return torch.tensor([bool(text) and automaton.step(state, text[-1]) is not None
                         for text in texts], dtype=torch.bool)


# -- 16.2 forced_text ---------------------------------------------------------------------------


def forced_text__through_accepting(automaton, state):
    """Goes on through accepting states: forces "de" after "abc" in ``abc(de)?``, where
    the output may also end."""
    text = []
    while len(automaton.transitions[state]) == 1:
        [(label, target)] = automaton.transitions[state]
        if label.single_char is None:
            break
        text.append(label.single_char)
        state = target
    return "".join(text)


def forced_text__follows_a_class(automaton, state):
    """Takes a one-move state as forced even when the move's label is a class ([0-9]),
    writing its first character."""
    text = []
    while not automaton.is_accepting(state) and len(automaton.transitions[state]) == 1:
        [(label, target)] = automaton.transitions[state]
        text.append(chr(label.ranges[0][0]))
        state = target
    return "".join(text)


def forced_text__first_char_only(automaton, state):
    """Returns only the first forced character instead of following the whole run."""
    moves = automaton.transitions[state]
    if automaton.is_accepting(state) or len(moves) != 1 or moves[0][0].single_char is None:
        return ""
    return moves[0][0].single_char


def forced_text__one_short(automaton, state):
    """Off by one: stops before the last forced character."""
    text = []
    while not automaton.is_accepting(state) and len(automaton.transitions[state]) == 1:
        [(label, target)] = automaton.transitions[state]
        if label.single_char is None:
            break
        text.append(label.single_char)
        state = target
    return "".join(text[:-1])


def forced_text__first_move_of_many(automaton, state):
    """Follows the first move whenever its label is one character, even when other moves
    leave the state too (``(ab|ac)d`` would force "ab")."""
    text = []
    while not automaton.is_accepting(state) and automaton.transitions[state]:
        label, target = automaton.transitions[state][0]
        if label.single_char is None:
            break
        text.append(label.single_char)
        state = target
    return "".join(text)


def forced_text__accepting_checked_after(automaton, state):
    """Checks for an accepting state only after taking a character: from an accepting
    state with one move (``abc`` in ``abc(de)?``) it still forces "d"."""
    text = []
    while len(automaton.transitions[state]) == 1:
        [(label, target)] = automaton.transitions[state]
        if label.single_char is None:
            break
        text.append(label.single_char)
        state = target
        if automaton.is_accepting(state):
            break
    return "".join(text)
