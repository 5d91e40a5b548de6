"""Small text statistics used by the demo."""


def word_count(text: str) -> int:
    """Number of words in ``text``; any run of whitespace separates words."""
    return text.count(" ") + 1


def longest_word(text: str) -> str:
    words = text.split()
    return max(words, key=len) if words else ""
