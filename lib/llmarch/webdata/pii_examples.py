"""A labelled set for :func:`llmarch.webdata.pii.find_pii`: web-like sentences with their true e-mail
addresses, phone numbers and IPv4 addresses, and sentences full of ordinary numbers that must stay.

Book: Pretraining data, "Personal information".

Each entry is ``(text, [(kind, substring), ...])`` with the pieces in order of appearance. Addresses use the
reserved domains ``example.com/org/net`` and fictional ones, IPv4 addresses the documentation and private
ranges, phone numbers the 555 range of North America and the drama ranges of the UK regulator: nothing here
reaches a real person. Some entries are hard on purpose (an obfuscated address, a seven-digit local number,
a four-part version number); the chapter reports the precision and recall that :func:`pii_scores` measures.
"""

PII_EXAMPLES: list[tuple[str, list[tuple[str, str]]]] = [
    # e-mail addresses
    ("Contact us at support@example.com for help.", [("EMAIL", "support@example.com")]),
    ("Send your CV to jane.doe+jobs@mail.example.org today.", [("EMAIL", "jane.doe+jobs@mail.example.org")]),
    ("Questions? Write to info@example.co.uk.", [("EMAIL", "info@example.co.uk")]),
    ("Reply to <bob_smith92@example.net> before Friday.", [("EMAIL", "bob_smith92@example.net")]),
    ("Maintainer: A. Ng (a.ng@cs.example.edu), 2019.", [("EMAIL", "a.ng@cs.example.edu")]),
    ("mailto:sales-team@shop.example.com", [("EMAIL", "sales-team@shop.example.com")]),
    (
        "Either alice@example.com or ALICE@EXAMPLE.COM will reach her.",
        [("EMAIL", "alice@example.com"), ("EMAIL", "ALICE@EXAMPLE.COM")],
    ),
    ("Press enquiries: presse@beispiel.example.de, Tel. folgt.", [("EMAIL", "presse@beispiel.example.de")]),
    ("The form sends a copy to noreply@notifications.example.io.", [("EMAIL", "noreply@notifications.example.io")]),
    ("Write to jane [at] example [dot] org if the form fails.", [("EMAIL", "jane [at] example [dot] org")]),
    ("user%admin@example.com was in the leaked list.", [("EMAIL", "user%admin@example.com")]),
    ("Cc: o'brien@example.ie and the board.", [("EMAIL", "o'brien@example.ie")]),
    # phone numbers, North American
    ("Call (555) 123-4567 between 9 and 5.", [("PHONE", "(555) 123-4567")]),
    ("Phone: 555-867-5309, fax: 555-867-5310.", [("PHONE", "555-867-5309"), ("PHONE", "555-867-5310")]),
    ("Our hotline is 1-555-010-4477 (toll free).", [("PHONE", "1-555-010-4477")]),
    ("Text 555.234.9876 to join the list.", [("PHONE", "555.234.9876")]),
    ("Reach the desk on 555 301 2288 after noon.", [("PHONE", "555 301 2288")]),
    ("Dial +1 (555) 014-2233 from abroad.", [("PHONE", "+1 (555) 014-2233")]),
    ("For the front desk call 555-0199.", [("PHONE", "555-0199")]),
    # phone numbers, international and national
    ("London office: +44 20 7946 0958.", [("PHONE", "+44 20 7946 0958")]),
    ("Ruf uns an: +49 30 12345678 oder schreib uns.", [("PHONE", "+49 30 12345678")]),
    ("Appelez le +33 1 23 45 67 89 pour réserver.", [("PHONE", "+33 1 23 45 67 89")]),
    ("Mobile +91-98765-43210 (WhatsApp too).", [("PHONE", "+91-98765-43210")]),
    ("Tokyo branch +81 3-1234-5678.", [("PHONE", "+81 3-1234-5678")]),
    ("UK callers: 020 7946 0321, mobile 07700 900123.", [("PHONE", "020 7946 0321"), ("PHONE", "07700 900123")]),
    ("Berlin: (030) 1234567, Mo-Fr.", [("PHONE", "(030) 1234567")]),
    ("Réservations au 01 42 68 53 00.", [("PHONE", "01 42 68 53 00")]),
    (
        "Sydney +61 2 9876 5432 or Melbourne +61 3 9123 4567.",
        [("PHONE", "+61 2 9876 5432"), ("PHONE", "+61 3 9123 4567")],
    ),
    ("Call +353.1.555.0100 for Dublin.", [("PHONE", "+353.1.555.0100")]),
    # IPv4 addresses
    ("The server at 192.168.1.10 stopped responding.", [("IP_ADDRESS", "192.168.1.10")]),
    (
        "Blocked requests from 203.0.113.45 and 198.51.100.7.",
        [("IP_ADDRESS", "203.0.113.45"), ("IP_ADDRESS", "198.51.100.7")],
    ),
    ("Set the gateway to 10.0.0.1.", [("IP_ADDRESS", "10.0.0.1")]),
    ("Connection refused (192.0.2.255:8080).", [("IP_ADDRESS", "192.0.2.255")]),
    ("Log: client=172.16.254.3 status=403", [("IP_ADDRESS", "172.16.254.3")]),
    ("Ping 8.8.8.8 to test the network.", [("IP_ADDRESS", "8.8.8.8")]),
    ("Upgrade to version 2.0.1.3 before Monday.", []),
    # mixed
    (
        "Admin: root@example.net, IP 198.51.100.23, phone +44 20 7946 0000.",
        [("EMAIL", "root@example.net"), ("IP_ADDRESS", "198.51.100.23"), ("PHONE", "+44 20 7946 0000")],
    ),
    (
        "Questions to help@example.org or 555-222-3344; mirror at 203.0.113.9.",
        [("EMAIL", "help@example.org"), ("PHONE", "555-222-3344"), ("IP_ADDRESS", "203.0.113.9")],
    ),
    ("Contact: tom@example.com | +1 555 019 8899", [("EMAIL", "tom@example.com"), ("PHONE", "+1 555 019 8899")]),
    # ordinary numbers that must stay
    ("The company was founded in 1998 and moved in 2004.", []),
    ("Prices start at $1,299.99 and go up to $2,450.", []),
    ("Python 3.11.2 fixed the bug reported in 3.10.4.", []),
    ("The meeting is on 2023-05-14 at 14:30.", []),
    ("Deadline: 05/06/2023, 11:59 pm.", []),
    ("Population: 1,234,567 (census of 2011).", []),
    ("ISBN 978-3-16-148410-0, 2nd edition, 352 pages.", []),
    ("Order number 4481920375 has shipped.", []),
    ("The ratio was 3.14159 and the error 0.0001.", []),
    ("Room 101, Building 7, 221B Baker Street.", []),
    ("Zip code 94105-1234, San Francisco.", []),
    ("Scores: 98-87-76 in the three rounds.", []),
    ("Coordinates 51.5074, -0.1278 mark the spot.", []),
    ("In 2020, 45% of 3,200 users chose option 2.", []),
    ("Runs at 60 fps on 4 GB of RAM and a 2.4 GHz CPU.", []),
    ("The 1.2.3.4.5 release train is long.", []),
    ("Item SKU 12-345-67890 is back in stock.", []),
    ("Temperatures ranged from -5 to 35 degrees.", []),
    ("Chapter 12, verses 3-17, and footnote 4.", []),
    ("Between 1914 and 1918 about 9.7 million soldiers died.", []),
    ("The amount is 0.75 EUR per 100 g.", []),
    ("Version 10.0.19045 of Windows shipped in 2022.", []),
    ("Call of Duty sold 25 million copies in 2019.", []),
    ("The @example account posted 1,024 updates.", []),
    ("Files are at example.com/reports/2023/q1.pdf.", []),
    ("Card ending 4242 was charged 19.99 on 12.03.2024.", []),
    ("Flight BA 2490 departs at 07:45 from gate 23.", []),
    ("Invoice 2023-0456-789 is due in 30 days.", []),
]
"""At least sixty labelled strings: text and its true spans as ``(kind, substring)`` pairs."""
