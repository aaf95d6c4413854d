"""An independent solution of ps3-tokenizers: written from the release notebook's text alone."""
ANSWERS = {
    "get_pair_stats": '''def get_pair_stats(vocab):
    """{"l o w </w>": 5, ...} -> {("l", "o"): 5, ...}: counts of adjacent symbol pairs, weighted by the word counts."""
    stats = {}
    for word, count in vocab.items():
        symbols = word.split()
        for left, right in zip(symbols, symbols[1:]):
            stats[(left, right)] = stats.get((left, right), 0) + count
    return stats
''',
    "merge_pair": '''def merge_pair(pair, vocab):
    """A new vocab in which every adjacent occurrence of the symbols pair = (a, b) is replaced by the symbol a + b."""
    first, second = pair
    merged = {}
    for word, count in vocab.items():
        pending = word.split()[::-1]  # a stack: the next symbol is at the end
        out = []
        while pending:
            symbol = pending.pop()
            if symbol == first and pending and pending[-1] == second:
                pending.pop()
                out.append(first + second)
            else:
                out.append(symbol)
        merged[" ".join(out)] = count
    return merged
''',
    "train_bpe": '''def train_bpe(word_counts, num_merges):
    """{"low": 5, ...}, num_merges -> the list of merged pairs [("e", "s"), ...], in the order they were learned."""
    vocab = {" ".join(list(word) + ["</w>"]): count for word, count in word_counts.items()}
    merges = []
    for _ in range(num_merges):
        stats = get_pair_stats(vocab)
        if not stats:
            break
        best_pair, best_count = None, None
        for pair, count in stats.items():  # strictly larger only: the first of equal counts stays
            if best_count is None or count > best_count:
                best_pair, best_count = pair, count
        merges.append(best_pair)
        vocab = merge_pair(best_pair, vocab)
    return merges
''',
    "bpe_segment": '''def bpe_segment(word, merges):
    """"lowest", merges -> ["low", "est</w>"]: the word's symbols after replaying the merges in order."""
    symbols = list(word) + ["</w>"]
    for a, b in merges:
        out, i = [], 0
        while i < len(symbols):
            if i + 1 < len(symbols) and symbols[i] == a and symbols[i + 1] == b:
                out.append(a + b)
                i += 2
            else:
                out.append(symbols[i])
                i += 1
        symbols = out
    return symbols
''',
    "wordpiece_encode": '''def wordpiece_encode(word, vocab, unk="[UNK]", max_chars=100):
    """"hugs", vocab -> ["hug", "##s"]: greedy longest-match-first; [unk] if the word cannot be segmented."""
    if len(word) > max_chars:
        return [unk]
    known = set(vocab)
    pieces, start = [], 0
    while start < len(word):
        prefix = "" if start == 0 else "##"
        found = None
        for end in range(len(word), start, -1):
            if prefix + word[start:end] in known:
                found = end
                break
        if found is None:
            return [unk]
        pieces.append(prefix + word[start:found])
        start = found
    return pieces
''',
    "viterbi_segment": '''def viterbi_segment(word, log_probs):
    """"abab", {"a": -1.0, "b": -2.0, "ab": -2.5} -> (["ab", "ab"], -5.0): the most probable segmentation."""
    n = len(word)
    best = [0.0] + [-math.inf] * n
    back = [0] * (n + 1)
    for end in range(1, n + 1):
        for start in range(end):
            piece = word[start:end]
            if piece in log_probs and best[start] > -math.inf:
                score = best[start] + log_probs[piece]
                if score > best[end]:
                    best[end], back[end] = score, start
    pieces, end = [], n
    while end > 0:
        pieces.append(word[back[end]:end])
        end = back[end]
    return pieces[::-1], float(best[n])
''',
}
