"""acetools_course.page: report tables (digits, no NaN) and figure alt text."""

from __future__ import annotations


def test_page_table_formats_digits_and_missing_values():
    import math

    import pandas as pd

    from acetools_course.page import NA, table

    df = pd.DataFrame({"method": ["ace", "ta"], "acc": [71.23456, math.nan], "coef": [None, 0.3]})
    html = table(df, 1, index=False).to_html()
    assert "71.2" in html and "71.23" not in html and NA in html and "NaN" not in html and "nan" not in html
    html = table(df, {"acc": "{:.3g}"}, caption="cap").to_html()
    assert "71.2" in html and "cap" in html


def test_alt_text_reads_the_figure_titles():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from acetools_course.page import alt_text

    fig, axes = plt.subplots(1, 2)
    axes[0].set_title("energy")
    axes[1].set_xlabel("rank k")
    fig.suptitle("ESD vs SVD")
    assert alt_text(fig) == "Figure: ESD vs SVD; energy; value against rank k"
    plt.close(fig)


def test_page_table_has_one_header_row():
    import pandas as pd

    from acetools_course import page

    df = pd.DataFrame({"variant": ["a", "a", "b", "b"], "suite": ["t8", "t20"] * 2, "test_acc": [1.0, 2, 3, 4],
                       "alpha": [0.1, 0.2, 0.3, 0.4]})
    wide = df.pivot(index="variant", columns="suite", values=["test_acc", "alpha"])
    html = page.table(wide, {"test_acc": 2, "alpha": 1}).to_html()
    assert html.count("<tr>", 0, html.index("<tbody>")) == 1  # one header row, not three
    assert "test_acc · t8" in html and "alpha · t20" in html and "variant" in html
    assert "1.00" in html and "0.1" in html
