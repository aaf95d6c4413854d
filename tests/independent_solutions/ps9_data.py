"""An independent solution of ps9-data: written from the release notebook's text alone."""
ANSWERS = {
    "shingles": '''def shingles(text, ngram=5):
    """The sorted list of distinct word ngram-grams of text (words: the runs of letters, digits and underscores of
    the lower-cased text). Fewer than ngram words (but at least one): one shingle of all the words; no word: []."""
    words = re.findall(r"\\w+", text.lower())
    if not words:
        return []
    if len(words) < ngram:
        return [" ".join(words)]
    found = set()
    for start in range(len(words) - ngram + 1):
        found.add(" ".join(words[start:start + ngram]))
    return sorted(found)
''',
    "jaccard": '''def jaccard(a, b):
    """|A & B| / |A | B| for the sets A = set(a), B = set(b); 1.0 when both are empty."""
    a, b = set(a), set(b)
    union = len(a | b)
    if union == 0:
        return 1.0
    return len(a & b) / union
''',
    "minhash_signature": '''def minhash_signature(items, num_perm=128, seed=0):
    """(num_perm,) integer array: sig[i] = min over items of (a_i * stable_hash(item) + b_i) mod P, with a, b drawn
    by np.random.default_rng(seed); the empty set gives np.full(num_perm, P)."""
    rng = np.random.default_rng(seed)
    a = rng.integers(1, P, size=num_perm, dtype=np.int64)
    b = rng.integers(0, P, size=num_perm, dtype=np.int64)
    distinct = sorted(set(items))
    if not distinct:
        return np.full(num_perm, P, dtype=np.int64)
    x = np.array([stable_hash(item) for item in distinct], dtype=np.int64)
    values = (a[:, None] * x[None, :] + b[:, None]) % P          # (num_perm, number of items)
    return values.min(axis=1)
''',
    "lsh_probability": '''def lsh_probability(s, bands, rows):
    """P(s) = 1 - (1 - s**rows)**bands for a number or an array s (same shape)."""
    s = np.asarray(s, dtype=np.float64)
    return 1.0 - (1.0 - s**rows) ** bands
''',
    "choose_bands": '''def choose_bands(threshold, num_perm=128):
    """(bands, rows), bands * rows <= num_perm, minimising 1/2 * integral_0^t P + 1/2 * integral_t^1 (1 - P)
    (trapezoid rule, 1001 points per interval); ties: fewest bands, then fewest rows."""
    below = np.linspace(0.0, threshold, 1001)
    above = np.linspace(threshold, 1.0, 1001)
    best, best_error = None, np.inf
    for bands in range(1, num_perm + 1):
        for rows in range(1, num_perm // bands + 1):
            false_positive = np.trapezoid(1.0 - (1.0 - below**rows) ** bands, below)
            false_negative = np.trapezoid((1.0 - above**rows) ** bands, above)
            error = 0.5 * false_positive + 0.5 * false_negative
            if error < best_error:
                best, best_error = (bands, rows), error
    return best
''',
    "c4_line_filter": '''def c4_line_filter(line, min_words_per_line=5):
    """None if C4 keeps the line, else the first rule that drops it: "word_too_long", "no_terminal_punctuation",
    "too_few_words", "lorem_ipsum", "javascript", "curly_bracket" or "policy"."""
    line = line.strip()
    if any(len(word) > 1000 for word in line.split()):
        return "word_too_long"
    line = CITATION.sub("", line).strip()
    if not line.endswith(END_MARKS) or line.endswith("..."):
        return "no_terminal_punctuation"
    if len(line.split()) < min_words_per_line:
        return "too_few_words"
    lower = line.lower()
    if "lorem ipsum" in lower:
        return "lorem_ipsum"
    if "javascript" in lower:
        return "javascript"
    if "{" in line:
        return "curly_bracket"
    if any(phrase in lower for phrase in POLICY_PHRASES):
        return "policy"
    return None
''',
    "redact_pii": '''_EMAIL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._%+-]*@(?:[A-Za-z0-9-]+\\.)+[A-Za-z]{2,}")
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])"
# the text: not after a letter, digit, _ or '.'; not followed by a letter, digit, _, or '.' and a digit
_IPV4 = re.compile(rf"(?<![\\w.]){_OCTET}(?:\\.{_OCTET}){{3}}(?!\\w)(?!\\.[0-9])")
_NUMBER_END = r"(?!\\w)(?![.-][0-9])"
_NORTH_AMERICAN = re.compile(r"(?<![^\\W_])(?<![+.-])(?:1-)?"
                             r"(?:\\([0-9]{3}\\) ?[0-9]{3}[ .-][0-9]{4}|[0-9]{3}([ .-])[0-9]{3}\\1[0-9]{4})" + _NUMBER_END)
_COUNTRY_CODE = re.compile(r"\\+[0-9]{1,3}(?![0-9])")
_FIRST_GROUP = re.compile(r"[ -](?:\\([0-9]+\\)|[0-9]+)")
_NEXT_GROUP = re.compile(r"[ -][0-9]+")
_ENDS_THERE = re.compile(_NUMBER_END)


def _international_end(text, start):
    """The end of the longest international number starting with the '+' at text[start] (8 to 15 digits, ending
    at a digit that nothing longer follows), or None."""
    code = _COUNTRY_CODE.match(text, start)
    if code is None:
        return None
    digits, position, group_pattern, end = len(code.group()) - 1, code.end(), _FIRST_GROUP, None
    while (group := group_pattern.match(text, position)) is not None:
        digits += sum(ch.isdigit() for ch in group.group())
        position, group_pattern = group.end(), _NEXT_GROUP
        if digits > 15:
            break
        if digits >= 8 and text[position - 1].isdigit() and _ENDS_THERE.match(text, position):
            end = position
    return end


def _redact_international(text):
    pieces, done, plus = [], 0, text.find("+")
    while plus != -1:
        end = None
        if plus == 0 or not (text[plus - 1].isalnum() or text[plus - 1] == "+"):
            end = _international_end(text, plus)
        if end is None:
            plus = text.find("+", plus + 1)
        else:
            pieces += [text[done:plus], "<PHONE>"]
            done = end
            plus = text.find("+", end)
    return "".join(pieces) + text[done:]


def redact_pii(text):
    """text with e-mail addresses -> <EMAIL>, IPv4 addresses -> <IP_ADDRESS>, phone numbers -> <PHONE>."""
    text = _EMAIL.sub("<EMAIL>", text)
    text = _IPV4.sub("<IP_ADDRESS>", text)
    text = _redact_international(text)
    return _NORTH_AMERICAN.sub("<PHONE>", text)
''',
}
