"""See the search: one offline HTML page of each problem's thought tree and the engine's work.

`seed-tot view RUN_DIR ... --output PAGE.html` (and `seed-tot solve ... --view`) call
`seed_tot.view.page.write_page`; `seed_tot.view.node_work` records, during a solve, what the engine
spent on each node. Nothing is imported here, so the search can import node_work without the page.
"""
