"""Seeded synthetic WebShop catalogue, synthetic goals (the WebShop way) and a BM25 product search.

What it builds, for `build_shop(num_products, catalog_seed, goal_seed)`:
- products: dicts with WebShop's keys after `load_products` (asin, category, query, product_category, name,
  Title, Description, BulletPoints, Attributes, options {name: [values]}, pricing, Price, Rating 'N.A.',
  Reviews [], instruction_text, instruction_attributes) over 30 product types in WebShop's 5 categories
  (beauty, electronics, fashion, food, furniture). Prices are one value or a range; the price used by the
  reward is drawn once per product like `generate_product_prices` (uniform inside a range), here from the
  catalogue seed.
- goals: `get_synthetic_goals` semantics: one goal per (product, option combination), option names sorted,
  instruction_text = instruction + ` with {name}: {value}, and ...` +
  `, and price lower than {X:.2f} dollars`, price_upper = the larger of two draws among the first four values
  of the grid 10, 20, ..., 990 above the price (1000000 and no price text with fewer than two), weight =
  mean 1/count of the goal's attributes. The goal list is then shuffled with the goal seed (upstream:
  `random.seed(233); random.shuffle(goals)`).
- search: BM25 over the lowercased Title + Description + first bullet point + option text (what WebShop
  indexes), top 50 hits.

Deviations from WebShop:
1. The catalogue is generated, not scraped: vocabulary is ours; product text contains no digits, and an option
   value that occurs inside its product's text is dropped (harmless: WebShop's option reward has no text
   fall-back, only the attribute reward has one; option values stay apart from the text all the same).
2. BM25 is a local implementation with Lucene's idf and pyserini's defaults (k1=0.9, b=0.4), lowercase
   alphanumeric tokens with possessive 's removed, an English stopword list and plural-s stripping instead of
   Lucene's Porter stemmer. Ties keep catalogue order (Lucene: docid order).
3. All randomness is seeded (upstream draws prices and price bounds from the unseeded global RNG).
4. `search[<r>]` samples from the shop's own seeded RNG (upstream: the global RNG).
5. `search[<a> ...]` gives an empty results page; upstream's text env raises a TypeError there (it passes no
   attribute index to the search).
"""
import functools
import itertools
import math
import random
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

SEARCH_RETURN_N = 50
PRICE_RANGE = [10.0 * i for i in range(1, 100)]

# (category, query, product_category, title noun, instruction noun, article, attributes, options, price lo-hi)
PRODUCT_TYPES = [
    ("beauty", "shampoo", "Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos", "Shampoo",
     "shampoo", "a ", ["sulfate free", "paraben free", "natural ingredients", "dry hair", "hair growth",
                       "cruelty free", "color safe"],
     {"scent": ["lavender", "coconut", "eucalyptus", "citrus", "unscented", "vanilla"],
      "size": ["8 fl oz", "16 fl oz", "32 fl oz"]}, (6, 40)),
    ("beauty", "lip gloss", "Beauty & Personal Care › Makeup › Lips › Lip Glosses", "Lip Gloss", "lip gloss",
     "a ", ["long lasting", "cruelty free", "non toxic", "high shine", "moisturizing", "vegan"],
     {"color": ["red", "pink", "nude", "coral", "plum", "berry"]}, (4, 25)),
    ("beauty", "hair extensions",
     "Beauty & Personal Care › Hair Care › Hair Extensions, Wigs & Accessories › Extensions",
     "Clip In Hair Extensions", "clip in hair extensions", "", ["natural looking", "heat resistant",
     "easy to apply", "human hair", "thick volume", "silky soft"], {"color": ["black", "brown", "blonde",
     "auburn", "grey"], "size": ["14 inch", "18 inch", "22 inch"]}, (15, 90)),
    ("beauty", "face moisturizer", "Beauty & Personal Care › Skin Care › Face › Creams & Moisturizers",
     "Face Moisturizer Cream", "face moisturizer", "a ", ["dry skin", "fragrance free", "anti aging",
     "hyaluronic acid", "oil free", "sensitive skin"], {"size": ["1.7 oz", "3.4 oz", "5 oz"]}, (8, 60)),
    ("beauty", "nail polish",
     "Beauty & Personal Care › Foot, Hand & Nail Care › Nail Art & Polish › Nail Polish", "Nail Polish",
     "nail polish", "", ["quick drying", "long lasting", "non toxic", "chip resistant", "high gloss"],
     {"color": ["red", "pink", "purple", "teal", "gold", "silver", "white", "black"]}, (3, 18)),
    ("beauty", "electric toothbrush",
     "Beauty & Personal Care › Oral Care › Toothbrushes & Accessories › Electric", "Electric Toothbrush",
     "electric toothbrush", "an ", ["rechargeable", "waterproof", "travel case", "sensitive teeth",
     "long battery life", "smart timer"], {"color": ["black", "white", "blue", "pink"]}, (20, 150)),
    ("electronics", "wireless earbuds", "Electronics › Headphones, Earbuds & Accessories › Earbuds",
     "Wireless Earbuds", "wireless earbuds", "a pair of ", ["noise cancelling", "bluetooth",
     "water resistant", "long battery life", "charging case", "hands free"], {"color": ["black", "white",
     "blue", "red"]}, (15, 200)),
    ("electronics", "hdmi cable", "Electronics › Television & Video › Accessories › Cables › HDMI Cables",
     "HDMI Cable", "hdmi cable", "an ", ["high speed", "gold plated", "braided", "ethernet",
     "high definition"], {"size": ["3 ft", "6 ft", "10 ft", "15 ft"]}, (5, 30)),
    ("electronics", "phone case", "Cell Phones & Accessories › Cases, Holsters & Sleeves › Basic Cases",
     "Phone Case", "phone case", "a ", ["shockproof", "slim fit", "wireless charging", "scratch resistant",
     "kickstand"], {"color": ["black", "clear", "blue", "green", "purple"]}, (6, 30)),
    ("electronics", "portable charger", "Electronics › Computers & Accessories › Power Banks",
     "Portable Charger", "portable charger", "a ", ["fast charging", "usb c", "compact", "led display",
     "high capacity"], {"color": ["black", "white", "blue"]}, (15, 80)),
    ("electronics", "computer mouse",
     "Electronics › Computers & Accessories › Keyboards, Mice & Accessories › Mice", "Computer Mouse",
     "computer mouse", "a ", ["wireless", "ergonomic", "silent click", "usb receiver", "adjustable dpi"],
     {"color": ["black", "grey", "white", "pink"]}, (8, 60)),
    ("electronics", "led desk lamp",
     "Tools & Home Improvement › Lighting & Ceiling Fans › Lamps & Shades › Desk Lamps", "LED Desk Lamp",
     "led desk lamp", "an ", ["dimmable", "eye caring", "usb charging port", "touch control",
     "adjustable arm"], {"color": ["black", "white", "silver"]}, (15, 70)),
    ("fashion", "men's running shoes", "Clothing, Shoes & Jewelry › Men › Shoes › Athletic › Running",
     "Men's Running Shoes", "men's running shoes", "a pair of ", ["lightweight", "rubber sole", "breathable",
     "non slip", "lace up closure", "memory foam"], {"color": ["black", "navy", "grey", "white", "red",
     "blue"], "size": ["7", "8", "9", "10", "11", "12"]}, (25, 120)),
    ("fashion", "women's t-shirt",
     "Clothing, Shoes & Jewelry › Women › Clothing › Tops, Tees & Blouses › T-Shirts", "Women's T-Shirt",
     "women's t-shirt", "a ", ["short sleeve", "cotton", "machine wash", "loose fit", "crew neck"],
     {"color": ["black", "white", "pink", "green", "yellow"], "size": ["small", "medium", "large",
     "x-large"]}, (8, 35)),
    ("fashion", "men's jeans", "Clothing, Shoes & Jewelry › Men › Clothing › Jeans", "Men's Jeans",
     "men's jeans", "a pair of ", ["slim fit", "stretch", "machine wash", "button closure", "relaxed fit"],
     {"color": ["blue", "black", "grey", "khaki"], "size": ["30w x 30l", "32w x 32l", "34w x 32l",
     "36w x 34l"]}, (20, 70)),
    ("fashion", "women's sandals", "Clothing, Shoes & Jewelry › Women › Shoes › Sandals", "Women's Sandals",
     "women's sandals", "a pair of ", ["open toe", "ankle strap", "arch support", "rubber sole",
     "comfortable"], {"color": ["black", "brown", "white", "beige"], "size": ["6", "7", "8", "9", "10"]},
     (15, 60)),
    ("fashion", "backpack",
     "Clothing, Shoes & Jewelry › Luggage & Travel Gear › Backpacks › Laptop Backpacks", "Laptop Backpack",
     "laptop backpack", "a ", ["water resistant", "laptop compartment", "lightweight", "multiple pockets",
     "padded straps"], {"color": ["black", "grey", "navy", "green", "pink"]}, (20, 80)),
    ("fashion", "knit beanie",
     "Clothing, Shoes & Jewelry › Women › Accessories › Hats & Caps › Skullies & Beanies", "Knit Beanie Hat",
     "knit beanie", "a ", ["warm", "soft", "hand wash", "acrylic", "stretchy"], {"color": ["black", "grey",
     "red", "white", "navy", "olive"]}, (6, 25)),
    ("food", "green tea", "Grocery & Gourmet Food › Beverages › Coffee, Tea & Cocoa › Tea › Green",
     "Green Tea Bags", "green tea", "some ", ["organic", "non gmo", "gluten free", "individually wrapped",
     "natural ingredients"], {"flavor": ["jasmine", "ginger", "honey", "peach", "lemon"], "size": ["20 count",
     "40 count", "100 count"]}, (5, 30)),
    ("food", "coffee beans",
     "Grocery & Gourmet Food › Beverages › Coffee, Tea & Cocoa › Coffee › Whole Coffee Beans",
     "Whole Bean Coffee", "whole bean coffee", "some ", ["medium roast", "dark roast", "organic",
     "fair trade", "low acid"], {"size": ["12 ounce", "2 pound", "5 pound"]}, (8, 50)),
    ("food", "protein bars", "Grocery & Gourmet Food › Snack Foods › Bars › Protein Bars", "Protein Bars",
     "protein bars", "some ", ["high protein", "gluten free", "low sugar", "keto friendly",
     "individually wrapped"], {"flavor": ["chocolate", "peanut butter", "vanilla", "cookie dough"],
     "size": ["12 count", "24 count"]}, (10, 45)),
    ("food", "mixed nuts", "Grocery & Gourmet Food › Snack Foods › Nuts & Seeds › Mixed Nuts", "Mixed Nuts",
     "mixed nuts", "some ", ["lightly salted", "roasted", "non gmo", "resealable bag", "kosher"],
     {"size": ["16 ounce", "32 ounce", "48 ounce"]}, (8, 40)),
    ("food", "olive oil", "Grocery & Gourmet Food › Pantry Staples › Cooking Oils › Olive Oil", "Olive Oil",
     "olive oil", "some ", ["extra virgin", "cold pressed", "non gmo", "glass bottle", "kosher"],
     {"size": ["500ml", "750ml", "1 liter"]}, (8, 45)),
    ("food", "dark chocolate", "Grocery & Gourmet Food › Candy & Chocolate › Chocolate Bars",
     "Dark Chocolate Bars", "dark chocolate", "some ", ["sugar free", "dairy free", "vegan", "fair trade",
     "individually wrapped"], {"flavor": ["sea salt", "almond", "orange", "raspberry", "mint"],
     "size": ["3 pack", "6 pack", "12 pack"]}, (5, 35)),
    ("furniture", "office chair", "Home & Kitchen › Furniture › Home Office Furniture › Home Office Chairs",
     "Office Chair", "office chair", "an ", ["ergonomic", "lumbar support", "adjustable height", "swivel",
     "breathable mesh", "padded armrests"], {"color": ["black", "grey", "white", "blue"]}, (60, 300)),
    ("furniture", "bookshelf", "Home & Kitchen › Furniture › Home Office Furniture › Bookcases", "Bookshelf",
     "bookshelf", "a ", ["easy assembly", "solid wood", "storage space", "space saving", "sturdy"],
     {"color": ["white", "black", "walnut", "espresso"], "size": ["3 tier", "4 tier", "5 tier"]}, (30, 200)),
    ("furniture", "bed sheets", "Home & Kitchen › Bedding › Sheets & Pillowcases › Sheet & Pillowcase Sets",
     "Bed Sheet Set", "bed sheet set", "a ", ["deep pocket", "machine wash", "wrinkle free", "breathable",
     "soft microfiber", "hypoallergenic"], {"color": ["white", "grey", "navy", "beige", "blue"],
     "size": ["twin", "full", "queen", "king"]}, (20, 90)),
    ("furniture", "throw pillow covers",
     "Home & Kitchen › Home Décor Products › Pillows › Throw Pillow Covers", "Throw Pillow Covers",
     "throw pillow covers", "", ["decorative", "double sided", "hidden zipper", "soft velvet",
     "machine wash"], {"color": ["green", "blue", "pink", "grey", "yellow"], "size": ["18 x 18 inch",
     "20 x 20 inch"]}, (10, 35)),
    ("furniture", "coffee table",
     "Home & Kitchen › Furniture › Living Room Furniture › Tables › Coffee Tables", "Coffee Table",
     "coffee table", "a ", ["easy assembly", "storage shelf", "solid wood", "modern design", "living room"],
     {"color": ["walnut", "black", "white", "natural"]}, (50, 250)),
    ("furniture", "area rug", "Home & Kitchen › Home Décor Products › Area Rugs, Runners & Pads › Area Rugs",
     "Area Rug", "area rug", "an ", ["non slip", "living room", "easy clean", "low pile", "stain resistant"],
     {"color": ["grey", "blue", "beige", "red", "green"], "size": ["3 x 5 ft", "5 x 7 ft", "8 x 10 ft"]},
     (30, 220)),
]

BRANDS = ["Aurelo", "Brisko", "Calmora", "Dunvale", "Evenly", "Fernwick", "Gallow", "Hestia", "Ivory Lane",
          "Juno", "Kestrel", "Lumio", "Marlowe", "Nordhaven", "Obelle", "Pinecrest", "Quillon", "Rivano",
          "Solenne", "Tidewell", "Umbra", "Velora", "Wrenly", "Xander", "Yarrow", "Zephyra", "Arbor",
          "Bexley", "Corvo", "Delmar"]
_FILLERS = ["Designed for everyday use.", "A thoughtful gift for friends and family.",
            "Backed by our customer care team.", "Made with quality materials.",
            "Simple to use out of the box.", "Loved by customers for its value."]
_OPENERS = ["i need", "i am looking for", "i want", "i'm looking for", "find me", "i would like"]
_STOPWORDS = frozenset(("a an and are as at be but by for if in into is it no not of on or such that "
                        "the their\nthen there these they this to was will with i me my we you your find "
                        "need want looking would like some").split())


def _title_case(phrase: str) -> str:
    return ' '.join(w[:1].upper() + w[1:] for w in phrase.split())


def _instruction(rng: random.Random, ptype: tuple, attrs: list[str]) -> tuple[str, list[str]]:
    """WebShop-style instruction text for a product and the attributes it mentions
    (instruction_attributes)."""
    art, noun = ptype[5], ptype[4]
    n = rng.choice([1, 2, 2, 3]) if len(attrs) >= 3 else min(2, len(attrs))
    used = rng.sample(attrs, n)

    def a(phrase: str) -> str:  # "a"/"an" agree with the word that follows
        return (("an " if phrase[0] in "aeiou" else "a ") if art in ("a ", "an ") else art) + phrase

    if n == 1:
        body = rng.choice([a(f"{noun} that is {used[0]}"), a(f"{used[0]} {noun}")])
    elif n == 2:
        body = rng.choice([a(f"{noun} that is {used[0]} and {used[1]}"),
                           a(f"{used[0]} {noun} with {used[1]}")])
    else:
        body = a(f"{noun} that is {used[0]}, {used[1]}, and {used[2]}")
    return f"{rng.choice(_OPENERS)} {body}", used


def _make_product(rng: random.Random, ptype: tuple, asin: str) -> dict:
    category, query, path, title_noun, noun, _, attr_pool, option_pool, (lo, hi) = ptype
    brand = rng.choice(BRANDS)
    attrs = rng.sample(attr_pool, rng.randint(3, min(4, len(attr_pool))))
    title = f"{brand} {title_noun} {_title_case(attrs[0])} {_title_case(attrs[1])}"
    description = (f"This {noun} from {brand} is {attrs[0]} and {attrs[1]}. "
                   f"It is also {', '.join(attrs[2:])}. {rng.choice(_FILLERS)}")
    bullets = [a[:1].upper() + a[1:] for a in attrs] + [rng.choice(_FILLERS)]
    text = ' '.join([title, description] + bullets).lower()
    options, seen = {}, set()
    for name, pool in option_pool.items():
        # deviation 1: keep option values out of the product text (the attribute reward does search that text)
        values = [v for v in pool if v not in text and v not in seen]
        values = sorted(rng.sample(values, min(len(values), rng.randint(2, 4))), key=pool.index)
        if len(values) >= 2:
            options[name] = values
            seen.update(values)
    low = round(rng.uniform(lo, hi), 2)
    pricing = [low, round(low * rng.uniform(1.1, 1.4), 2)] if rng.random() < 0.2 else [low]
    price_tag = f"${pricing[0]}" if len(pricing) == 1 else f"${pricing[0]} to ${pricing[1]}"
    instruction_text, instruction_attrs = _instruction(rng, ptype, attrs)
    return {'asin': asin, 'category': category, 'query': query, 'product_category': path, 'name': title,
            'Title': title, 'Description': description, 'BulletPoints': bullets, 'Attributes': attrs,
            'options': options, 'pricing': pricing, 'Price': price_tag, 'Rating': 'N.A.', 'Reviews': [],
            'instruction_text': instruction_text, 'instruction_attributes': instruction_attrs}


def build_products(num_products: int, seed: int) -> list[dict]:
    """`num_products` products, types drawn round-robin then shuffled, unique 10-character ASINs."""
    rng = random.Random(seed)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    asins: list[str] = []
    while len(asins) < num_products:
        asin = "B0" + ''.join(rng.choice(alphabet) for _ in range(8))
        if asin not in asins:
            asins.append(asin)
    types = [PRODUCT_TYPES[i % len(PRODUCT_TYPES)] for i in range(num_products)]
    rng.shuffle(types)
    return [_make_product(rng, ptype, asin) for ptype, asin in zip(types, asins)]


def product_prices(products: list[dict], seed: int) -> dict[str, float]:
    """generate_product_prices: a fixed price, or a uniform draw inside the price range (seeded)."""
    rng = random.Random(seed + 1)
    return {p['asin']: p['pricing'][0] if len(p['pricing']) == 1 else rng.uniform(*p['pricing'][:2])
            for p in products}


def synthesize_goals(products: list[dict], prices: dict[str, float], seed: int) -> list[dict]:
    """get_synthetic_goals + the SimServer shuffle, seeded."""
    rng = random.Random(seed)
    goals, cnt_atts = [], defaultdict(int)
    for product in products:
        asin, attributes = product['asin'], product['instruction_attributes']
        price_range = [p for p in PRICE_RANGE if p > prices[asin]][:4]
        if len(price_range) >= 2:
            _, price_upper = sorted(rng.sample(price_range, 2))
            price_text = f', and price lower than {price_upper:.2f} dollars'
        else:
            price_upper, price_text = 1000000, ''
        option_names = sorted(product['options'])
        for combination in itertools.product(*(product['options'][n] for n in option_names)):
            goal_options = dict(zip(option_names, combination))
            option_text = ', and '.join(f'{k}: {v}' for k, v in goal_options.items())
            option_text = ' with ' + option_text if option_text else ''
            goals.append({'asin': asin, 'category': product['category'], 'query': product['query'],
                          'name': product['Title'], 'product_category': product['product_category'],
                          'instruction_text': f"{product['instruction_text']}{option_text}{price_text}",
                          'attributes': attributes, 'price_upper': price_upper, 'goal_options': goal_options})
            for att in attributes:
                cnt_atts[att] += 1
    for goal in goals:
        goal['weight'] = sum(1.0 / cnt_atts[a] for a in goal['attributes']) / len(goal['attributes'])
    rng.shuffle(goals)
    return goals


def tokenize(text: str) -> list[str]:
    """Lowercase alphanumeric tokens, possessive 's and stopwords dropped, plural 's' stripped
    (deviation 2)."""
    out = []
    # possessives, as Lucene's English
    for tok in re.findall(r'[a-z0-9]+', re.sub(r"'s\b", '', text.lower())):
        if tok in _STOPWORDS:
            continue
        if len(tok) > 3 and tok.endswith('s') and not tok.endswith('ss'):
            tok = tok[:-1]
        out.append(tok)
    return out


def document_text(product: dict) -> str:
    """What WebShop indexes (convert_product_file_format.py): Title, Description, first bullet,
    option text."""
    option_text = ', and '.join(f"{k}: {', '.join(v)}" for k, v in product['options'].items())
    return ' '.join([product['Title'], product['Description'], product['BulletPoints'][0],
                     option_text]).lower()


class BM25:
    """Okapi BM25 with Lucene's idf (k1=0.9, b=0.4 as pyserini's LuceneSearcher defaults)."""

    def __init__(self, docs: list[str], k1: float = 0.9, b: float = 0.4):
        self.k1, self.b = k1, b
        tokenized = [tokenize(d) for d in docs]
        self.doc_len = [len(t) for t in tokenized]
        self.avgdl = sum(self.doc_len) / max(1, len(docs))
        self.postings: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for i, toks in enumerate(tokenized):
            for term, tf in Counter(toks).items():
                self.postings[term].append((i, tf))
        n = len(docs)
        self.idf = {t: math.log(1 + (n - len(p) + 0.5) / (len(p) + 0.5)) for t, p in self.postings.items()}

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[int]:
        """Indices of the top-k documents with a positive score, best first, ties in index order."""
        scores: dict[int, float] = defaultdict(float)
        for term in tokenize(query):
            for i, tf in self.postings.get(term, ()):
                norm = self.k1 * (1 - self.b + self.b * self.doc_len[i] / self.avgdl)
                scores[i] += self.idf[term] * tf * (self.k1 + 1) / (tf + norm)
        return sorted(scores, key=lambda i: (-scores[i], i))[:k]


@dataclass
class Shop:
    """Everything the embedded engine serves: products, their reward prices, shuffled goals,
    the search index."""
    products: list[dict]
    by_asin: dict[str, dict]
    prices: dict[str, float]
    goals: list[dict]
    index: BM25

    rng: random.Random = field(default_factory=lambda: random.Random(0))

    def search(self, keywords: list[str]) -> list[dict]:
        """get_top_n_product_from_keywords: BM25 over ' '.join(keywords), top 50, or one of WebShop's special
        queries when the first keyword is '<q>' (every product of that query), '<c>' (of that category, first
        word only), '<r>' (50 random products; deviation 4) or '<a>' (deviation 5: no products)."""
        head, rest = keywords[0], ' '.join(keywords[1:]).strip()
        if head == '<q>':
            return [p for p in self.products if p['query'] == rest]
        if head == '<c>':
            return ([p for p in self.products if p['category'] == keywords[1].strip()] if len(keywords) > 1
                    else [])
        if head == '<r>':
            return self.rng.sample(self.products, k=min(SEARCH_RETURN_N, len(self.products)))
        if head == '<a>':
            return []
        return [self.products[i] for i in self.index.search(' '.join(keywords))]


@functools.lru_cache(maxsize=4)
def build_shop(num_products: int, catalog_seed: int, goal_seed: int) -> Shop:
    """Deterministic shop for the seeds; cached per process (env instances share it read-only)."""
    if num_products < 1:
        raise ValueError(f"num_products must be >= 1, got {num_products}")
    products = build_products(num_products, catalog_seed)
    prices = product_prices(products, catalog_seed)
    goals = synthesize_goals(products, prices, goal_seed)
    index = BM25([document_text(p) for p in products])
    return Shop(products, {p['asin']: p for p in products}, prices, goals, index)
