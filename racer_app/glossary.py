"""The app's glossary: one plain-words definition per term, shown in the Glossary panel and as
hover text wherever the views use the term (`term`)."""
from __future__ import annotations

import html

#: Term -> definition, in the order a newcomer meets them.
GLOSSARY: dict[str, str] = {
    "token": "A piece of text the model reads and writes: a word, part of a word, a space or a symbol.",
    "forward pass": "One run of the model over its input. It costs about the same for one new token as for a "
                    "dozen, which is the slack speculative decoding uses.",
    "speculative decoding": "Guess several next tokens (a draft), let the model check them all in one forward "
                            "pass, keep those it agrees with. The text is exactly what the model writes alone.",
    "special token": "A control token of the chat template, such as <|im_start|> and <|im_end|> (a message "
                     "starts, a message ends). The model reads and writes them like words; the text hides them.",
    "root token": "x0: the token the model has just fixed. Every draft tree starts from it.",
    "draft tree": "The guesses of one step: several candidates for the next token, and candidates after each.",
    "step": "One draft-and-verify round: draft a tree, check it in one forward pass, commit the accepted tokens. "
            "A run's last record may commit a token without a forward pass.",
    "accepted path": "The branch of the draft tree the model agreed with, token for token, from the root down.",
    "MAT": "Mean accepted tokens: tokens written per forward pass (the prompt's forward counted). Plain decoding "
           "has MAT 1.",
    "automaton": "RACER's memory of the text so far: every stretch of up to 10 tokens, stored in a trie (an "
                 "Aho–Corasick automaton) that can say at once what followed a given ending before.",
    "match state": "The automaton node for the longest stored string that ends the text so far (in RACER: the last "
                   "whole window stored).",
    "failure link": "From an automaton node, a jump to the longest shorter ending of its string that is also "
                    "stored. Following them finds every stored ending of the text.",
    "border": "A stored string of at least 2 tokens that ends the text plus x0. What grew below it before is "
              "what retrieval proposes.",
    "LRU eviction": "When the automaton is full, the leaf used least recently is recycled to make room.",
    "copy-logit": "For every token, the model's top next tokens from the last time that token was fed to it. "
                  "The logits tree copies these rows: ‘what the model predicted here before’.",
    "breadth rule": "How many entries of a row the logits tree expands: the best entry gets the most children, "
                    "each next rank half as many.",
    "prompt lookup": "Copy what followed an earlier occurrence of the last few tokens (a chain of up to 16 tokens, "
                     "32 behind a long match). Plain prompt lookup copies the latest occurrence; RACER's chain "
                     "copies the one whose text agrees furthest back, and adds it to its tree. transformers "
                     "offers prompt lookup alone as prompt_lookup_num_tokens.",
    "merge": "Putting every source's candidates into one trie: a path two sources proposed becomes one branch "
             "(‘both’).",
    "sizer": "Chooses each step how many candidate nodes to verify: those the model is most likely to accept, as "
             "many as pay off on this machine's cost curve.",
    "cost curve": "How long one forward pass takes for a tree of T tokens on this machine. On a GPU it is nearly "
                  "flat; on a small CPU it climbs, so CPU trees stay small.",
    "capacity": "The most nodes a draft tree may have (root included), or ‘auto’: chosen every step by the sizer.",
    "tree attention": "The mask that lets one forward pass check a whole tree: each node sees the context and its "
                      "own ancestors, never its siblings' branches.",
    "greedy": "Always write the model's most likely token. Speculative decoding then gives exactly the same text.",
    "floating-point tie": "Two tokens whose scores are so close that rounding in a different order (a tree forward "
                          "versus a plain one) can flip which is first. The texts may then differ there; neither is "
                          "wrong.",
}

_KEYS = {k.lower(): k for k in GLOSSARY}


def definition(word: str) -> str | None:
    key = word.lower()
    for form in (key, key.rstrip("s"), key[:-2] if key.endswith("es") else key):
        if form in _KEYS:
            return GLOSSARY[_KEYS[form]]
    return None


def term(word: str) -> str:
    """`word` with its definition as hover text (Markdown-safe HTML); plain if not in the glossary."""
    d = definition(word)
    if d is None:
        return html.escape(word)
    return f'<abbr class="racer-term" title="{html.escape(d, quote=True)}">{html.escape(word)}</abbr>'


def glossary_md() -> str:
    return "\n".join(f"- **{k}**: {v}" for k, v in GLOSSARY.items())
