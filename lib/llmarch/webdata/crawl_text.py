"""The words and sentences of the synthetic crawl: English prose on a dozen topics, spam, and sentences in
German, French, Spanish and Italian (all written for this course).

Book: Pretraining data, "From a crawl to text".

English prose comes from about sixty sentence templates whose slots (``{noun}``, ``{adj}``, ``{verb}``,
``{person}``, ``{place}``, numbers, months...) are filled from the word lists of a topic, so two pages on one
topic share words but rarely a run of five. A page never uses a template twice, which keeps it clear of
Gopher's repetition rules (its duplicate 5-grams come from chance alone). The foreign-language pages are
shuffled selections of sentences written directly in each language.

:func:`english_paragraphs` and :func:`foreign_paragraphs` take a ``random.Random``: the same generator state
gives the same text.
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass

__all__ = [
    "Topic",
    "TOPICS",
    "FOREIGN_SENTENCES",
    "LICENCE_PASSAGE",
    "QUOTED_PASSAGE",
    "LOREM_IPSUM",
    "plural",
    "english_sentence",
    "english_paragraphs",
    "page_title",
    "foreign_paragraphs",
    "slug",
]


@dataclass(frozen=True)
class Topic:
    """The vocabulary of one topic: singular nouns, adjectives, verbs (base form, taking an object), people
    (singular), places, and the site that writes about it.

    Book: Pretraining data, "From a crawl to text"
    """

    name: str
    site: str
    nouns: tuple[str, ...]
    adjectives: tuple[str, ...]
    verbs: tuple[str, ...]
    people: tuple[str, ...]
    places: tuple[str, ...]


def _words(text: str) -> tuple[str, ...]:
    return tuple(w.strip() for w in text.split(",") if w.strip())


TOPICS = (
    Topic(
        "gardening", "greenfingers-journal.example",
        _words("rose, tomato plant, compost heap, seedling, raised bed, hedge, lawn, watering can, trellis, "
               "greenhouse, bulb, pruning saw, potato patch, herb border, apple tree, mulch layer"),
        _words("hardy, leggy, sheltered, waterlogged, sunny, frost-tender, vigorous, neglected, fragrant, "
               "compact, overgrown, drought-resistant"),
        _words("prune, repot, water, stake, feed, divide, harvest, transplant, mulch, protect, sow, thin out"),
        _words("gardener, allotment holder, nursery owner, beginner, grower, neighbour"),
        _words("the allotment, the back garden, the walled garden, the village show, the garden centre, "
               "the community orchard"),
    ),
    Topic(
        "astronomy", "darksky-diary.example",
        _words("telescope, eyepiece, star chart, red torch, binocular mount, nebula, planet, meteor shower, "
               "finder scope, tripod, camera sensor, double star, comet, filter wheel, mirror, observing log"),
        _words("faint, bright, steady, dew-covered, portable, wide-field, cheap, well-collimated, distant, "
               "blurry, crisp, overexposed"),
        _words("observe, align, photograph, collimate, sketch, track, locate, calibrate, focus, record, "
               "identify, stack"),
        _words("observer, amateur astronomer, club member, stargazer, astrophotographer, newcomer"),
        _words("the hilltop car park, the club observatory, the back yard, the moorland site, "
               "the coastal path, the dark-sky park"),
    ),
    Topic(
        "baking", "flour-and-oven.example",
        _words("sourdough loaf, starter, pie crust, baking tray, rye flour, proving basket, oven thermometer, "
               "cinnamon roll, shortbread, dough hook, sponge cake, rolling pin, bread tin, pastry brush, "
               "focaccia, oat biscuit"),
        _words("crusty, dense, airy, buttery, underproofed, golden, soggy, flaky, tangy, sticky, "
               "overbaked, wholesome"),
        _words("knead, proof, shape, score, glaze, fold, weigh, bake, cool, slice, freeze, rest"),
        _words("home baker, pastry chef, grandmother, apprentice, food writer, neighbour"),
        _words("the farmhouse kitchen, the village bakery, the market stall, the cookery school, "
               "the church fete, the corner cafe"),
    ),
    Topic(
        "cycling", "long-road-cycling.example",
        _words("touring bike, chain, rear derailleur, pannier, saddle, inner tube, cassette, brake pad, "
               "handlebar bag, frame pump, mudguard, crank, wheel rim, head torch, cycle computer, tyre lever"),
        _words("squeaky, lightweight, rusty, sturdy, punctured, reliable, worn, stiff, comfortable, "
               "overloaded, well-oiled, muddy"),
        _words("adjust, lubricate, replace, inflate, pack, true, clean, fit, tighten, service, patch, carry"),
        _words("cyclist, bike mechanic, commuter, tourer, club rider, shop assistant"),
        _words("the canal towpath, the mountain pass, the ring road, the old railway line, "
               "the river valley, the coast road"),
    ),
    Topic(
        "birdwatching", "hedgerow-birding.example",
        _words("field guide, spotting scope, bird feeder, nest box, wren, heron, reed warbler, notebook, "
               "song recording, migrant flock, woodpecker, swift, hide, kestrel, sparrow, barn owl"),
        _words("secretive, noisy, elusive, common, rare, restless, speckled, migrating, juvenile, "
               "territorial, shy, unmistakable"),
        _words("spot, count, ring, record, follow, photograph, listen for, feed, identify, survey, "
               "report, watch"),
        _words("birdwatcher, ranger, volunteer, ornithologist, twitcher, warden"),
        _words("the estuary, the reed bed, the old quarry, the nature reserve, the village pond, "
               "the woodland edge"),
    ),
    Topic(
        "local history", "parish-past.example",
        _words("parish register, mill, tithe map, photograph, gravestone, coaching inn, census return, "
               "market charter, letter, bridge, ledger, railway station, church bell, estate map, "
               "school logbook, diary"),
        _words("forgotten, medieval, faded, handwritten, disputed, well-preserved, Victorian, ruined, "
               "surprising, local, damaged, original"),
        _words("transcribe, date, catalogue, photograph, restore, compare, trace, digitise, archive, "
               "interpret, map, study"),
        _words("historian, archivist, churchwarden, local resident, researcher, schoolteacher"),
        _words("the county record office, the old market square, the parish church, the village hall, "
               "the former mill, the town museum"),
    ),
    Topic(
        "home repair", "fix-it-weekend.example",
        _words("leaking tap, skirting board, window frame, radiator, floorboard, door hinge, fuse box, "
               "plaster wall, gutter, shelf bracket, sealant gun, spirit level, drill bit, paint roller, "
               "washer, extension lead"),
        _words("loose, damp, cracked, sturdy, crooked, draughty, noisy, freshly painted, stubborn, "
               "rotten, flush, temporary"),
        _words("sand, seal, repair, level, fix, drill, paint, bleed, measure, insulate, sand down, fill"),
        _words("plumber, joiner, electrician, landlord, homeowner, decorator"),
        _words("the spare room, the cellar, the hallway, the garden shed, the loft, the kitchen"),
    ),
    Topic(
        "programming", "small-programs-blog.example",
        _words("unit test, function, database query, log file, command line, configuration file, "
               "pull request, compiler warning, text editor, build script, stack trace, cache, "
               "regular expression, virtual machine, code review, parser"),
        _words("slow, readable, brittle, concise, flaky, legacy, well-tested, clever, verbose, "
               "deterministic, nested, forgotten"),
        _words("refactor, debug, profile, document, rewrite, deploy, review, benchmark, simplify, "
               "test, version, split"),
        _words("developer, maintainer, reviewer, student, team lead, open-source contributor"),
        _words("the office, the conference hall, the university lab, the coworking space, "
               "the evening class, the hackathon"),
    ),
    Topic(
        "sailing", "tidal-waters-sailing.example",
        _words("dinghy, mainsail, jib sheet, tiller, mooring buoy, tide table, life jacket, anchor, "
               "chart plotter, rudder, boom, fender, bilge pump, compass, harbour wall, reef point"),
        _words("choppy, gusty, sheltered, leaky, salty, slack, tidal, fresh, sluggish, close-hauled, "
               "well-trimmed, sun-bleached"),
        _words("trim, rig, launch, steer, anchor, reef, moor, tack, navigate, bail out, haul, secure"),
        _words("sailor, skipper, harbour master, crew member, instructor, fisherman"),
        _words("the estuary mouth, the sailing club, the outer harbour, the sandbank, the marina, "
               "the lighthouse point"),
    ),
    Topic(
        "photography", "light-and-lens.example",
        _words("lens, tripod, shutter release, light meter, memory card, prime lens, polarising filter, "
               "darkroom, film roll, flash unit, camera bag, lens hood, portrait, landscape, histogram, "
               "reflector"),
        _words("sharp, grainy, overexposed, soft, moody, wide, fast, vintage, cluttered, balanced, "
               "underexposed, striking"),
        _words("frame, expose, develop, crop, meter, focus, edit, print, scan, compose, bracket, light"),
        _words("photographer, editor, model, darkroom technician, hobbyist, gallery owner"),
        _words("the harbour front, the city market, the studio, the old docks, the botanical garden, "
               "the high street"),
    ),
    Topic(
        "beekeeping", "hive-notes.example",
        _words("hive, queen, brood frame, smoker, honey super, bee suit, swarm, hive tool, wax foundation, "
               "nectar flow, feeder, colony, queen excluder, varroa board, honey jar, apiary"),
        _words("calm, defensive, thriving, weak, crowded, honey-heavy, queenless, busy, healthy, "
               "gentle, dwindling, productive"),
        _words("inspect, feed, split, requeen, extract, smoke, treat, mark, move, check, clean, insulate"),
        _words("beekeeper, bee inspector, mentor, honey seller, apprentice, association member"),
        _words("the apiary, the orchard, the allotment site, the heather moor, the farm gate, "
               "the honey show"),
    ),
    Topic(
        "hiking", "ridge-and-valley-walks.example",
        _words("hiking boot, rucksack, map case, walking pole, water bottle, waterproof jacket, "
               "trail marker, stile, summit cairn, compass bearing, flask, first aid kit, gaiter, "
               "footpath, bothy, headland"),
        _words("boggy, steep, windswept, well-marked, rocky, gentle, exposed, overgrown, slippery, "
               "remote, waymarked, scenic"),
        _words("climb, cross, follow, pack, waterproof, navigate, descend, plan, explore, map, "
               "repair, shorten"),
        _words("walker, mountain guide, rambler, farmer, ranger, hill runner"),
        _words("the upper valley, the ridge path, the youth hostel, the reservoir, the old drove road, "
               "the moorland edge"),
    ),
)
"""The English topics: each page is about one topic, and its site is the topic's domain."""

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")

# Templates: {noun}, {noun2} (a different noun), {nouns} (plural), {adj}, {adj2}, {verb}, {person}, {people},
# {place}, {number} (2-12), {big} (20-500), {year}, {month}, {weekday}, {price}. A template starting with a
# slot is capitalised after filling.
_TEMPLATES = (
    "Most {people} agree that a {adj} {noun} is easier to {verb} than a {adj2} one.",
    "In {month} the {nouns} around {place} start to look {adj}, and that is the best time to {verb} them.",
    "If you want to {verb} a {noun}, start with a {adj} {noun2} and plenty of patience.",
    "A {adj} {noun} needs about {number} minutes of attention every week, more in a wet spring.",
    "The {noun} and the {noun2} are often confused, but they serve very different purposes.",
    "It took me {number} attempts before I could {verb} a {noun} without asking for help.",
    "Keep a notebook of every {noun} you {verb}; after a season the patterns become obvious.",
    "There is no single right way to {verb} a {noun}, only ways that suit your {noun2}.",
    "Our local group meets on the first {weekday} of each month to {verb} {nouns} together.",
    "Prices for a decent {noun} range from {price} to well over twice that, depending on the {noun2}.",
    "Why do so many {people} ignore the {noun} until something goes wrong?",
    "Do not underestimate how much a {adj} {noun2} can change the final result.",
    "The old {noun} in {place} still does its job after {big} years of use.",
    "My advice to any new {person} is simple: {verb} the {noun} first and worry about the {noun2} later.",
    "A friend who works as a {person} showed me how to {verb} a {noun} in under {number} minutes.",
    "When the weather turns, a {adj} {noun} becomes a real problem for anyone near {place}.",
    "I wrote about the {noun} last {month}, and several readers asked for a longer explanation.",
    "You will need a {noun}, a {noun2} and an afternoon with nothing else planned.",
    "The first thing to check is whether the {noun} is {adj} or merely {adj2}.",
    "Back in {year}, nobody at {place} had heard of a {adj} {noun}.",
    "Each {noun} is slightly different, so take the figures below as a rough guide rather than a rule.",
    "According to one {person} I spoke to, about {big} {nouns} were counted in a single weekend.",
    "It is tempting to {verb} everything at once, but a {adj} {noun} rewards a slower approach.",
    "Some {people} swear by a {adj} {noun}, while others would never go near one.",
    "The results were better than expected: {number} out of {number2} {nouns} turned out {adj}.",
    "What surprised me most was how quickly a {noun} can go from {adj} to {adj2}.",
    "Leave the {noun} alone for a day or two before you try to {verb} it again.",
    "On a quiet {weekday} in {month}, {place2} is almost empty, which makes it ideal for practice.",
    "Several readers have written to ask whether a {adj} {noun} is worth the money.",
    "In my experience the {noun2} matters far more than the brand of {noun} you choose.",
    "A {person} from the next town once told me to {verb} the {noun} before breakfast, and it worked.",
    "Please be careful with the {noun}; a moment of haste can undo a week of work.",
    "We spent most of the afternoon trying to {verb} a {noun} that refused to cooperate.",
    "The usual mistake is to buy an expensive {noun} before learning to {verb} a cheap one.",
    "By the end of {month} the {nouns} had become noticeably {adj}.",
    "The library at {place} holds a surprising number of books about the {noun}.",
    "Nobody enjoys having to {verb} a {adj} {noun}, yet it is rarely as hard as it looks.",
    "Think of the {noun} as a long-term project rather than a weekend job.",
    "With {number} {nouns} and a single {noun2}, you can already do a great deal.",
    "Our {person} keeps a spare {noun} in the car for exactly this kind of situation.",
    "Once you have learned to {verb} one {noun}, the next {number} come much more easily.",
    "Last {month} a group of {people} gathered at {place} to compare their {nouns}.",
    "Not every {noun} needs to be perfect; a {adj} one often has more character.",
    "The difference between a {adj} {noun} and a {adj2} one is usually a matter of care, not money.",
    "Anyone who has tried to {verb} a {noun} in the rain knows how quickly the fun disappears.",
    "I still remember the first {noun} I saw at {place}, and how {adj} it looked.",
    "Good {people} share what they know, and the best ones admit what they got wrong.",
    "Since {year} the number of {people} in our area has roughly doubled.",
    "Ask around at {place}; someone there will lend you a {noun} for the day.",
    "It pays to {verb} the {noun2} every few weeks instead of waiting for a crisis.",
    "Those who {verb} their {nouns} regularly report far fewer problems over the year.",
    "The manual says to {verb} the {noun} weekly, but once a month has been enough for us.",
    "A {adj} {noun} on a {adj2} day is one of the small pleasures of this hobby.",
    "After {number} seasons I finally understand why experienced {people} talk about the {noun} so much.",
    "You can {verb} a {noun} with almost any tool, though a proper {noun2} makes it safer.",
    "Try to write down what you did, when you did it and what happened to the {noun} afterwards.",
    "For a first attempt, choose a {adj} {noun} and keep the {noun2} simple.",
    "The shop near {place} sells a {adj} {noun} for about {price}, which seems fair.",
    "We will come back to the {noun} in a later post, once the {nouns} have settled.",
    "If the {noun} looks {adj}, stop, take a breath and check the {noun2} before going further.",
)

# Titles of articles; the same slots as the sentences.
_TITLES = (
    "How to {verb} a {adj} {noun}",
    "{number} things I learned about the {noun}",
    "Notes on the {nouns} at {place}",
    "A beginner's guide to the {noun}",
    "Why every {person} needs a {noun2}",
    "What to do with a {adj} {noun}",
    "The {noun} in {month}: a short report",
    "Ten years of {nouns}",
)

LICENCE_PASSAGE = (
    "This article is shared under the Open Hobby Notes licence. You may copy, translate and republish it "
    "in print or online, for any purpose, provided that you name the original author, link back to the "
    "page where it first appeared, and state clearly whether you changed anything. The licence gives no "
    "warranty of any kind: the advice above reflects one person's experience, and you follow it at your "
    "own risk and under your own judgement."
)
"""A boilerplate licence that some pages append to their article: a long passage shared across pages."""

QUOTED_PASSAGE = (
    "As the old handbook put it, nobody becomes good at anything by reading about it; you learn by doing "
    "the work badly at first, by noticing what went wrong, and by doing it again a little less badly the "
    "next day, until one morning you realise that the hard part has quietly become the easy part and you "
    "can no longer remember why it ever felt difficult."
)
"""A paragraph that several pages quote: another long passage shared across pages."""

LOREM_IPSUM = (
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et "
    "dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco laboris nisi ut aliquip "
    "ex ea commodo consequat. Duis aute irure dolor in reprehenderit in voluptate velit esse cillum dolore eu "
    "fugiat nulla pariatur. Excepteur sint occaecat cupidatat non proident, sunt in culpa qui officia deserunt "
    "mollit anim id est laborum."
)
"""The typesetters' placeholder text, as left on unfinished pages."""

FOREIGN_SENTENCES = {
    "de": (
        "Im Frühling beginnt die Arbeit im Garten schon früh am Morgen, wenn der Boden noch feucht ist.",
        "Unsere Nachbarn haben im letzten Jahr einen kleinen Gemüsegarten hinter dem Haus angelegt.",
        "Wer zum ersten Mal Brot backt, sollte sich für den Teig ausreichend Zeit nehmen.",
        "Die Wanderung führt zunächst durch einen dichten Wald und dann steil hinauf zum Gipfel.",
        "Am Wochenende trifft sich der Verein im alten Rathaus, um über neue Projekte zu sprechen.",
        "Viele Leser haben uns gefragt, welches Fahrrad sich für lange Touren am besten eignet.",
        "Die Geschichte unseres Dorfes ist älter, als die meisten Bewohner vermuten.",
        "Bei klarem Himmel kann man von hier aus mit bloßem Auge mehrere Planeten erkennen.",
        "Es lohnt sich, die Werkzeuge nach jedem Einsatz gründlich zu reinigen und trocken zu lagern.",
        "Im Herbst ziehen tausende Vögel über den See in Richtung Süden.",
        "Meine Großmutter hat dieses Rezept jahrzehntelang für die ganze Familie gekocht.",
        "Die Preise für gutes Material sind in den letzten Jahren deutlich gestiegen.",
        "Nach dem Regen war der Weg so rutschig, dass wir nur langsam vorankamen.",
        "Für Anfänger empfehlen wir, mit einem einfachen Projekt zu beginnen und geduldig zu bleiben.",
        "Das Museum zeigt alte Fotografien, Briefe und Karten aus dem neunzehnten Jahrhundert.",
        "Wir danken allen Helferinnen und Helfern, die das Fest auch dieses Jahr möglich gemacht haben.",
        "Wenn das Wetter mitspielt, fahren wir am Sonntag mit dem Boot hinaus auf den See.",
        "In der Werkstatt riecht es nach Holz, Leim und frischer Farbe.",
    ),
    "fr": (
        "Au printemps, le travail au jardin commence tôt le matin, quand la terre est encore humide.",
        "Nos voisins ont installé l'an dernier un petit potager derrière leur maison.",
        "Pour réussir un bon pain, il faut laisser à la pâte le temps de lever.",
        "La randonnée traverse d'abord une forêt épaisse, puis monte en pente raide jusqu'au sommet.",
        "Le week-end, l'association se réunit à l'ancienne mairie pour parler des nouveaux projets.",
        "Beaucoup de lecteurs nous demandent quel vélo convient le mieux aux longs voyages.",
        "L'histoire de notre village est plus ancienne que la plupart des habitants ne le pensent.",
        "Par une nuit claire, on peut voir plusieurs planètes à l'œil nu depuis cette colline.",
        "Il vaut mieux nettoyer les outils après chaque usage et les ranger dans un endroit sec.",
        "En automne, des milliers d'oiseaux survolent le lac en direction du sud.",
        "Ma grand-mère a préparé cette recette pour toute la famille pendant des décennies.",
        "Le prix du bon matériel a nettement augmenté au cours des dernières années.",
        "Après la pluie, le chemin était si glissant que nous avancions très lentement.",
        "Pour les débutants, nous conseillons de commencer par un projet simple et de rester patients.",
        "Le musée présente de vieilles photographies, des lettres et des cartes du dix-neuvième siècle.",
        "Nous remercions tous les bénévoles qui ont rendu la fête possible cette année encore.",
        "Si le temps le permet, nous sortirons dimanche en bateau sur le lac.",
        "Dans l'atelier, on sent l'odeur du bois, de la colle et de la peinture fraîche.",
    ),
    "es": (
        "En primavera, el trabajo en el huerto empieza temprano, cuando la tierra todavía está húmeda.",
        "Nuestros vecinos plantaron el año pasado un pequeño huerto detrás de su casa.",
        "Para hacer un buen pan hay que dejar que la masa repose el tiempo necesario.",
        "La ruta atraviesa primero un bosque espeso y después sube con fuerte pendiente hasta la cumbre.",
        "Los fines de semana, la asociación se reúne en el antiguo ayuntamiento para hablar de proyectos.",
        "Muchos lectores nos preguntan qué bicicleta es la más adecuada para los viajes largos.",
        "La historia de nuestro pueblo es más antigua de lo que piensa la mayoría de sus vecinos.",
        "En una noche despejada se pueden ver varios planetas a simple vista desde esta colina.",
        "Conviene limpiar las herramientas después de cada uso y guardarlas en un lugar seco.",
        "En otoño, miles de aves cruzan el lago rumbo al sur.",
        "Mi abuela preparó esta receta para toda la familia durante décadas.",
        "El precio del buen material ha subido bastante en los últimos años.",
        "Después de la lluvia el camino estaba tan resbaladizo que avanzábamos muy despacio.",
        "A los principiantes les recomendamos empezar con un proyecto sencillo y tener paciencia.",
        "El museo muestra fotografías antiguas, cartas y mapas del siglo diecinueve.",
        "Damos las gracias a todos los voluntarios que hicieron posible la fiesta un año más.",
        "Si el tiempo lo permite, el domingo saldremos en barco por el lago.",
        "En el taller huele a madera, a cola y a pintura fresca.",
    ),
    "it": (
        "In primavera il lavoro nell'orto comincia presto, quando la terra è ancora umida.",
        "I nostri vicini hanno piantato l'anno scorso un piccolo orto dietro la casa.",
        "Per fare un buon pane bisogna lasciare all'impasto il tempo di lievitare.",
        "Il sentiero attraversa prima un bosco fitto e poi sale ripido fino alla cima.",
        "Nel fine settimana l'associazione si riunisce nel vecchio municipio per discutere dei progetti.",
        "Molti lettori ci chiedono quale bicicletta sia più adatta ai viaggi lunghi.",
        "La storia del nostro paese è più antica di quanto pensino gli abitanti.",
        "In una notte limpida si possono vedere diversi pianeti a occhio nudo da questa collina.",
        "Conviene pulire gli attrezzi dopo ogni uso e riporli in un luogo asciutto.",
        "In autunno migliaia di uccelli sorvolano il lago diretti verso sud.",
        "Mia nonna ha preparato questa ricetta per tutta la famiglia per decenni.",
        "Il prezzo del materiale buono è aumentato parecchio negli ultimi anni.",
        "Dopo la pioggia il sentiero era così scivoloso che avanzavamo molto lentamente.",
        "Ai principianti consigliamo di iniziare con un progetto semplice e di avere pazienza.",
        "Il museo espone vecchie fotografie, lettere e carte del diciannovesimo secolo.",
        "Ringraziamo tutti i volontari che anche quest'anno hanno reso possibile la festa.",
        "Se il tempo lo permette, domenica usciremo in barca sul lago.",
        "Nel laboratorio si sente l'odore del legno, della colla e della vernice fresca.",
    ),
}
"""Sentences written for the course in German, French, Spanish and Italian (ISO 639-1 codes)."""

SPAM_PRODUCTS = ("replica watches", "cheap flights", "casino bonus", "diet pills", "payday loans",
                 "free followers", "discount sunglasses", "crypto signals")
"""What the keyword-stuffing and link-farm pages try to sell."""

_SLOT = re.compile(r"\{(\w+)\}")
_A_BEFORE_VOWEL = re.compile(r"\b([Aa]) (?=[aeiou](?!ni|se))")  # "a elusive wren" -> "an elusive wren"


def plural(noun: str) -> str:
    """The plural of a regular English noun phrase (its last word changes): ``"compost heap" ->
    "compost heaps"``, ``"hobby" -> "hobbies"``, ``"bush" -> "bushes"``, ``"hive tool" -> "hive tools"``.

    Book: Pretraining data, "From a crawl to text"
    """
    if not isinstance(noun, str) or not noun.strip():
        raise ValueError(f"noun must be a non-empty str, got {noun!r}")
    if noun.endswith("y") and noun[-2:-1] not in tuple("aeiou"):
        return noun[:-1] + "ies"
    if noun.endswith(("s", "x", "z", "ch", "sh")):
        return noun + "es"
    return noun + "s"


def _fill(template: str, topic: Topic, rng: random.Random) -> str:
    noun, noun2 = rng.sample(topic.nouns, 2)
    adj, adj2 = rng.sample(topic.adjectives, 2)
    place, place2 = rng.sample(topic.places, 2)
    number = rng.randint(2, 12)
    person = rng.choice(topic.people)
    values = {
        "noun": noun, "noun2": noun2, "nouns": plural(noun), "adj": adj, "adj2": adj2,
        "verb": rng.choice(topic.verbs), "person": person, "people": plural(person),
        "place": place, "place2": place2, "number": str(number), "number2": str(number + rng.randint(1, 20)),
        "big": str(rng.randint(20, 500)), "year": str(rng.randint(1950, 2015)), "month": rng.choice(MONTHS),
        "weekday": rng.choice(WEEKDAYS), "price": f"£{rng.randint(5, 400)}",
    }
    text = _A_BEFORE_VOWEL.sub(r"\1n ", _SLOT.sub(lambda m: values[m.group(1)], template))
    return text[0].upper() + text[1:]


def english_sentence(topic: Topic, rng: random.Random) -> str:
    """One English sentence about ``topic``: a random template with its slots filled.

    Book: Pretraining data, "From a crawl to text"
    """
    return _fill(rng.choice(_TEMPLATES), topic, rng)


def english_paragraphs(topic: Topic, rng: random.Random, n_paragraphs: int, sentences: tuple[int, int] = (3, 6)
                       ) -> list[str]:
    """``n_paragraphs`` paragraphs of ``sentences[0]..sentences[1]`` sentences about ``topic``; no template is
    used twice on one page (so at most ``len(_TEMPLATES)`` sentences).

    Book: Pretraining data, "From a crawl to text"
    """
    counts = [rng.randint(*sentences) for _ in range(n_paragraphs)]
    if sum(counts) > len(_TEMPLATES):
        raise ValueError(f"{sum(counts)} sentences asked, but there are only {len(_TEMPLATES)} templates")
    templates = rng.sample(_TEMPLATES, sum(counts))
    paragraphs, start = [], 0
    for count in counts:
        paragraphs.append(" ".join(_fill(t, topic, rng) for t in templates[start : start + count]))
        start += count
    return paragraphs


def page_title(topic: Topic, rng: random.Random) -> str:
    """A headline for an article about ``topic``.

    Book: Pretraining data, "From a crawl to text"
    """
    return _fill(rng.choice(_TITLES), topic, rng)


def foreign_paragraphs(language: str, rng: random.Random, n_paragraphs: int) -> list[str]:
    """``n_paragraphs`` paragraphs of 3-4 sentences in ``language`` (a key of :data:`FOREIGN_SENTENCES`), each
    sentence used at most once.

    Book: Pretraining data, "From a crawl to text"
    """
    if language not in FOREIGN_SENTENCES:
        raise ValueError(f"language must be one of {sorted(FOREIGN_SENTENCES)}, got {language!r}")
    sentences = list(FOREIGN_SENTENCES[language])
    rng.shuffle(sentences)
    paragraphs = []
    for _ in range(n_paragraphs):
        take = rng.randint(3, 4)
        paragraphs.append(" ".join(sentences[:take]))
        sentences = sentences[take:]
    return paragraphs


def slug(text: str) -> str:
    """A URL path segment from a title: ``"How to prune a hardy rose" -> "how-to-prune-a-hardy-rose"``.

    Book: Pretraining data, "From a crawl to text"
    """
    kept = "".join(c if c in string.ascii_lowercase + string.digits else "-" for c in text.lower())
    return "-".join(part for part in kept.split("-") if part)
