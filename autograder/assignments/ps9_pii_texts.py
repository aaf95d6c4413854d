"""Sentences for ps9-data's hidden checks of ``redact_pii`` (``ps9_data.py``): e-mail and IPv4 addresses, phone
numbers in the notebook's formats, dotted numbers that are not addresses, and ordinary numbers, each drawn from a
generator; the sentences with personal data come with their redaction."""

from __future__ import annotations


FIRST = ["jane", "bob", "anna", "li", "omar", "sofia", "kai", "maria", "tom", "ines"]
LAST = ["doe", "smith", "ng", "garcia", "khan", "meyer", "rossi", "kim"]
DOMAINS = ["example.com", "example.org", "example.net", "mail.example.com", "cs.example.edu", "shop.example.co.uk",
           "example.io", "news.example.de"]


def _email(rng):
    first, last = str(rng.choice(FIRST)), str(rng.choice(LAST))
    local = str(rng.choice([first, f"{first}.{last}", f"{first}_{last}", f"{first}{int(rng.integers(1, 99))}",
                            f"{first}+news", f"{first[0]}.{last}", f"{first}-{last}"]))
    address = f"{local}@{rng.choice(DOMAINS)}"
    return address.upper() if rng.random() < 0.1 else address


def _ipv4(rng):
    return ".".join(str(int(o)) for o in rng.integers(0, 256, 4))


def _fill(template: str, values: dict[str, tuple[str, str]]) -> tuple[str, str]:
    """The text with each field's value, and the text as it must come out of redact_pii (placeholders)."""
    return (template.format(**{k: v for k, (v, _) in values.items()}),
            template.format(**{k: tag for k, (_, tag) in values.items()}))


def email_ip_text(rng) -> tuple[str, str]:
    """A sentence with e-mail and IPv4 addresses, and its redaction."""
    values = {"e1": (_email(rng), "<EMAIL>"), "e2": (_email(rng), "<EMAIL>"),
              "ip1": (_ipv4(rng), "<IP_ADDRESS>"), "ip2": (_ipv4(rng), "<IP_ADDRESS>")}
    templates = ["Contact {e1} for details.", "Write to {e1} or {e2}.", "The server {ip1} stopped responding.",
                 "Requests from {ip1} and {ip2} were blocked.", "Admin: {e1}, host {ip1}.",
                 "Send the form to <{e1}> today.", "Gateway ({ip1}) and mail ({e1}).", "Ping {ip1} first"]
    return _fill(str(rng.choice(templates)), values)


def not_ipv4_text(rng) -> str:
    """A sentence with dotted numbers that are not IPv4 addresses (an octet above 255, a fifth number, letters
    around): redact_pii must leave it unchanged."""
    octets = [str(int(o)) for o in rng.integers(0, 256, 4)]
    big = octets.copy()
    big[int(rng.integers(0, 4))] = str(int(rng.integers(256, 1000)))
    forms = [".".join(big), ".".join(octets + [str(int(rng.integers(0, 256)))]),
             "v" + ".".join(octets), ".".join(octets) + "a"]
    first, second = rng.choice(len(forms), 2, replace=False)
    return f"Build {forms[first]} replaced {forms[second]} last week."


def _digits(rng, n):
    return "".join(str(int(d)) for d in rng.integers(0, 10, n))


def _phone(rng):
    area, exchange, line = int(rng.integers(200, 1000)), int(rng.integers(200, 1000)), _digits(rng, 4)
    formats = [f"({area}) {exchange}-{line}", f"{area}-{exchange}-{line}", f"{area}.{exchange}.{line}",
               f"{area} {exchange} {line}", f"+1 {area} {exchange} {line}", f"+1 ({area}) {exchange}-{line}",
               f"1-{area}-{exchange}-{line}",
               f"+44 20 {_digits(rng, 4)} {_digits(rng, 4)}", f"+49 30 {_digits(rng, int(rng.integers(7, 9)))}",
               "+33 " + str(int(rng.integers(1, 10))) + "".join(f" {_digits(rng, 2)}" for _ in range(4)),
               f"+91-{_digits(rng, 5)}-{_digits(rng, 5)}", f"+81 3-{_digits(rng, 4)}-{_digits(rng, 4)}",
               f"+61 2 {_digits(rng, 4)} {_digits(rng, 4)}"]
    return str(rng.choice(formats))


def phone_text(rng) -> tuple[str, str]:
    """A sentence with phone numbers, and its redaction."""
    values = {"p1": (_phone(rng), "<PHONE>"), "p2": (_phone(rng), "<PHONE>")}
    templates = ["Call {p1} today.", "Phone: {p1}, fax: {p2}.", "Reach the desk on {p1}.", "Mobile {p1}",
                 "Our hotline is {p1} (toll free).", "Dial {p1} or {p2} from abroad."]
    return _fill(str(rng.choice(templates)), values)


def ordinary_text(rng) -> str:
    """A sentence of ordinary numbers that redact_pii must leave unchanged."""
    year, n = int(rng.integers(1900, 2030)), int(rng.integers(0, 6))
    choices = [
        f"The company was founded in {year} and moved in {year + int(rng.integers(1, 20))}.",
        f"Prices start at ${int(rng.integers(1, 10))},{_digits(rng, 3)}.{_digits(rng, 2)}.",
        f"Python 3.{int(rng.integers(5, 14))}.{int(rng.integers(0, 10))} fixed the bug.",
        f"The meeting is on {year}-{int(rng.integers(1, 13)):02d}-{int(rng.integers(1, 29)):02d} at "
        f"{int(rng.integers(0, 24)):02d}:{int(rng.integers(0, 60)):02d}.",
        f"Deadline: {int(rng.integers(1, 29)):02d}/{int(rng.integers(1, 13)):02d}/{year}.",
        f"Population: {int(rng.integers(1, 999))},{_digits(rng, 3)},{_digits(rng, 3)} in {year}.",
        f"ISBN 978-{int(rng.integers(0, 10))}-{_digits(rng, 2)}-{_digits(rng, 6)}-{int(rng.integers(0, 10))}, "
        f"{int(rng.integers(100, 900))} pages.",
        f"Order number {int(rng.integers(1, 10))}{_digits(rng, 9)} has shipped.",
        f"Windows 10.0.{int(rng.integers(10000, 30000))}.{int(rng.integers(1000, 9999))} shipped in {year}.",
        f"In {year}, {int(rng.integers(1, 100))}% of {int(rng.integers(1, 10))},{_digits(rng, 3)} users agreed.",
        f"Scores: {int(rng.integers(10, 100))}-{int(rng.integers(10, 100))}-{int(rng.integers(10, 100))} in "
        f"round {n + 1}.",
    ]
    return str(rng.choice(choices))
