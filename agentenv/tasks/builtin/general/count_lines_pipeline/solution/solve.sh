python3 /workspace/pipeline/fetch.py
# --- next call ---
python3 /workspace/pipeline/unpack.py
# --- next call ---
python3 /workspace/pipeline/clean.py
# --- next call ---
{% if (ending == "bare" and seed >= 1000) or seed % 3 == 0 %}grep -c '' /workspace/data.txt > /workspace/answer.txt{% else %}wc -l < /workspace/data.txt > /workspace/answer.txt{% endif %}
