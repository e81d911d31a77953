"""The scaffold job's defaults that its steps' own configs share with ScaffoldSettings (settings.py).

Apart so that the steps (encode.py, write.py) and the settings, which builds their configs, do not
import each other.
"""

LONG_DOC_POLICIES = ("skip", "chunk")  # what --long-docs does with a document over 1,000 words
DEFAULT_MAX_WORD_CHARS = 1000  # longer words are dropped, counted (transforms.scaffold.encode)
DEFAULT_ORDER_RANGES = 1024  # pieces each split's ordering is cut into (transforms.scaffold.write)
