import unittest

from textstats import longest_word, word_count


class WordCount(unittest.TestCase):
    def test_simple_sentence(self):
        self.assertEqual(word_count("the quick brown fox"), 4)

    def test_runs_of_whitespace(self):
        self.assertEqual(word_count("  the   quick\tbrown\nfox  "), 4)

    def test_empty_text_has_no_words(self):
        self.assertEqual(word_count(""), 0)

    def test_longest_word(self):
        self.assertEqual(longest_word("a bb ccc"), "ccc")


if __name__ == "__main__":
    unittest.main()
